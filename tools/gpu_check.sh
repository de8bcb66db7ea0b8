#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tools/gpu_check.sh: runs the device check (bench/gpu_check; docs/kernels.md, "The device
# check") on a GPU machine from a build made on a CPU machine.
#
#   tools/gpu_check.sh bundle BUILD_DIR BUNDLE_DIR
#       On the build machine: copies BUILD_DIR/bench/gpu_check and the shared libraries it needs
#       beyond glibc (Abseil, liburing, xxhash, libstdc++) into BUNDLE_DIR (and BUNDLE_DIR/lib),
#       a few MB that travel where the whole build directory would not. Put BUNDLE_DIR in an
#       ignored folder (build-kv/gpu-check-bundle) and carry it.
#   tools/gpu_check.sh run DIR OUT_DIR [gpu_check flags...]
#       On the GPU machine: DIR is a bundle or a build directory. Runs gpu_check under a 4-minute
#       timeout (its own --budget-s 180 keeps the timed repetitions inside it) and writes
#       OUT_DIR/gpu_check.json, OUT_DIR/gpu_check.txt (the table) and OUT_DIR/nvidia-smi.txt.
#       Exits with gpu_check's status (0 passed, 1 a check failed, 2 no device, 124 timed out).
#
# A session lent a GPU, from the repository root:
#   tools/gpu_check.sh bundle build-kv build-kv/gpu-check-bundle          # here
#   run(command="tools/gpu_check.sh run build-kv/gpu-check-bundle $OUT",   # there
#       carry=["build-kv/gpu-check-bundle"], timeout_s=300)
set -euo pipefail

usage() {
  sed -n '3,21p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

find_binary() {
  local dir=$1
  for b in "$dir/gpu_check" "$dir/bench/gpu_check"; do
    if [[ -x $b ]]; then
      echo "$b"
      return 0
    fi
  done
  echo "gpu_check.sh: no executable gpu_check in $dir or $dir/bench" >&2
  return 1
}

bundle() {
  local build=$1 dest=$2 bin
  bin=$(find_binary "$build")
  mkdir -p "$dest/lib"
  cp "$bin" "$dest/gpu_check"
  # Every resolved library but glibc's own (libc, libm, the loader, ...), which must be the
  # running system's.
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
      *) cp -L "$lib" "$dest/lib/" ;;
    esac
  done
  if ldd "$bin" | grep -q 'not found'; then
    echo "gpu_check.sh: $bin has unresolved libraries here:" >&2
    ldd "$bin" | grep 'not found' >&2
    exit 1
  fi
  echo "gpu_check.sh: bundled $(du -sh "$dest" | cut -f1) in $dest"
}

run() {
  local dir=$1 out=$2 bin
  shift 2
  bin=$(find_binary "$dir")
  mkdir -p "$out"
  if [[ -d $dir/lib ]]; then
    export LD_LIBRARY_PATH="$(cd "$dir/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  if ldd "$bin" | grep -q 'not found'; then
    echo "gpu_check.sh: missing shared libraries (bundle the build first):" >&2
    ldd "$bin" | grep 'not found' >&2
    exit 3
  fi
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
  else
    echo "nvidia-smi not found" > "$out/nvidia-smi.txt"
  fi
  local rc=0
  timeout -k 10 240 "$bin" --budget-s 180 --json "$out/gpu_check.json" "$@" \
    > "$out/gpu_check.txt" 2>&1 || rc=$?
  cat "$out/gpu_check.txt"
  if [[ $rc == 124 || $rc == 137 ]]; then
    echo "gpu_check.sh: gpu_check ran past its 240 s timeout" >&2
  fi
  echo "gpu_check.sh: exit $rc; in $out: $(cd "$out" && ls | tr '\n' ' ')"
  exit "$rc"
}

[[ $# -ge 3 ]] || usage
case $1 in
  bundle) bundle "$2" "$3" ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
