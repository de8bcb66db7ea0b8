#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# full_disk_test.sh KVCTL: a store on a small file system of its own (a 160 MiB ext4 image,
# loop-mounted), capped above what that file system holds, so that the disk fills before the cap
# does. Every Put must still succeed, by evicting to make room when the file system says ENOSPC,
# and the store must verify clean afterwards. Needs root and loop devices: where it cannot mount
# the image it says why and exits 77, which ctest reports as skipped.
set -euo pipefail
kvctl=$1
skip() { echo "full_disk_test: skipped: $*"; exit 77; }
fail() { echo "full_disk_test: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || skip "mounting a loop device needs root"
command -v mkfs.ext4 >/dev/null || skip "mkfs.ext4 is not installed (e2fsprogs)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckv-full-disk.XXXXXX")
mnt="$tmp/mnt"
cleanup() {
  if mountpoint -q "$mnt"; then umount "$mnt" || umount -l "$mnt" || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir "$mnt"
truncate -s 160M "$tmp/disk.img"
mkfs.ext4 -q -F -m 0 "$tmp/disk.img" >/dev/null 2>&1 || skip "mkfs.ext4 failed on $tmp/disk.img"
mount -o loop "$tmp/disk.img" "$mnt" 2>"$tmp/mount.log" ||
  skip "cannot loop-mount a file system here: $(head -c 200 "$tmp/mount.log")"

store="$mnt/store"
"$kvctl" init "$store" --max-disk-bytes 1073741824 >/dev/null  # a 1 GiB cap on a 160 MiB disk
evicted=0
for seed in $(seq 1 14); do  # 14 prefixes of 24 MiB: twice what the file system holds
  out=$("$kvctl" put "$store" --model qwen2.5-0.5b --tokens 2048 --seed "$seed" --json 2>"$tmp/put.log") ||
    fail "Put $seed failed on a full file system: $(cat "$tmp/put.log")"
  [[ "$out" =~ \"chunks_written\":128, ]] || fail "Put $seed did not write its 128 chunks: $out"
  [[ "$out" =~ \"chunks_evicted\":([0-9]+) ]] || fail "Put $seed printed no chunks_evicted: $out"
  evicted=$((evicted + BASH_REMATCH[1]))
done
((evicted > 0)) || fail "14 Puts of 24 MiB fit a 160 MiB file system without evicting"
"$kvctl" verify "$store" >"$tmp/verify.log" 2>&1 || fail "verify after the full disk: $(cat "$tmp/verify.log")"
# The newest prefix is whole: eviction took the least recently used first.
last=$("$kvctl" ls "$store" --json)
[[ "$last" =~ \"chunks\":128 ]] || fail "no whole prefix is left: $last"
# A Put larger than the whole file system is refused before it evicts anything.
before=$("$kvctl" ls "$store" --json)
if "$kvctl" put "$store" --model qwen2.5-0.5b --tokens 16384 --seed 99 >"$tmp/big.log" 2>&1; then
  fail "a 192 MiB Put into a 160 MiB file system succeeded: $(cat "$tmp/big.log")"
fi
grep -q "can never fit the file system" "$tmp/big.log" || fail "big Put: $(cat "$tmp/big.log")"
[[ "$("$kvctl" ls "$store" --json)" == "$before" ]] || fail "the refused big Put changed the store"

# The last resort works on a file system with no byte free: rm and gc open the store and free space.
fallocate -l "$(( $(stat -f -c '%a' "$mnt") * $(stat -f -c '%S' "$mnt") ))" "$mnt/filler" 2>/dev/null || true
dd if=/dev/zero of="$mnt/filler2" bs=4K status=none 2>/dev/null || true  # what fallocate left
sync
free_before=$(stat -f -c '%a' "$mnt")
(( free_before * $(stat -f -c '%S' "$mnt") < 65536 )) || fail "could not fill the file system: $free_before blocks free"
[[ "$before" =~ \"id\":\"([0-9a-f]+)\" ]] || fail "no prefix id in: $before"
prefix=${BASH_REMATCH[1]}
"$kvctl" rm "$store" "$prefix" >"$tmp/rm.log" 2>&1 || fail "rm on a full file system: $(cat "$tmp/rm.log")"
"$kvctl" gc "$store" >"$tmp/gc.log" 2>&1 || fail "gc on a full file system: $(cat "$tmp/gc.log")"
free_after=$(stat -f -c '%a' "$mnt")
(( free_after > free_before )) || fail "rm and gc freed nothing: $free_before -> $free_after blocks free"
rm -f "$mnt/filler" "$mnt/filler2"
"$kvctl" verify "$store" >"$tmp/verify.log" 2>&1 || fail "verify after rm on a full disk: $(cat "$tmp/verify.log")"
echo "full_disk_test: 14 Puts of 24 MiB into a 160 MiB file system under a 1 GiB cap all" \
     "succeeded, evicting $evicted chunks on ENOSPC; verify clean; a 192 MiB Put was refused" \
     "untouched; rm and gc freed $((free_after - free_before)) blocks on a full file system"
