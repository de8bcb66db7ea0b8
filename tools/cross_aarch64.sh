#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tools/cross_aarch64.sh: compiles every .cc of the library (common/, storage/, kernels/, remote/,
# prefetch/, engine/) for aarch64 with Debian's cross compiler, so that x86-only code (an
# unguarded <immintrin.h>, target attribute, __builtin_cpu_supports or xxh_x86dispatch.h) fails
# here rather than on a Grace Hopper machine. Objects go to a temporary directory and are thrown
# away; nothing is linked (there are no aarch64 builds of the dependencies to link against).
#
# The dependencies' headers are the x86 host's: Abseil, RocksDB, liburing, xxhash and hiredis install
# architecture-independent headers under /usr/include, and Debian's cross compiler searches
# /usr/include last, after its own C and C++ headers. So that nothing else of the host's comes in
# that way (an x86-only header such as xxh_x86dispatch.h, which would compile but not link on
# aarch64), every header a file pulls from /usr/include must belong to one of those
# dependencies; any other fails the file, named.
#
# Usage: tools/cross_aarch64.sh [--syntax-only]
#   --syntax-only   parse and check only (-fsyntax-only), about 2/3 of the CPU time of the
#                   default -c -O2; it still catches every x86 include, intrinsic, target
#                   attribute and CPU check, but not the warnings that need the optimiser
#                   (tools/ckv.sh test uses it)
# Environment:
#   CKV_CROSS_CXX     the cross compiler (default aarch64-linux-gnu-g++, from the Debian package
#                     g++-aarch64-linux-gnu)
#   CKV_CROSS_FLAGS   extra flags, e.g. -mcpu=neoverse-v2 for Grace
#   CKV_CROSS_JOBS    parallel compiles (default: nproc)
# Exit status: 0 when every file compiled; 1 when any failed (each named, with its errors); 2 when
# the cross compiler is missing or the arguments are wrong.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO_ROOT
readonly CXX="${CKV_CROSS_CXX:-aarch64-linux-gnu-g++}"
readonly JOBS="${CKV_CROSS_JOBS:-$(nproc 2>/dev/null || echo 2)}"
readonly DIRS=(common io storage kernels prefetch remote engine)
mode=(-O2)
mode_name="-c -O2"
case "${1:-}" in
  "") ;;
  --syntax-only)
    mode=(-fsyntax-only)
    mode_name="-fsyntax-only"
    ;;
  *)
    printf 'usage: %s [--syntax-only]\n' "$0" >&2
    exit 2
    ;;
esac

say() { printf 'cross_aarch64: %s\n' "$*" >&2; }

if ! command -v "$CXX" >/dev/null 2>&1; then
  say "$CXX not found; install it with: apt-get install g++-aarch64-linux-gnu"
  exit 2
fi

start_ns="$(date +%s%N)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ckv-cross-aarch64.XXXXXX")"
trap 'rm -rf -- "$tmp"' EXIT
mkdir -p "$tmp/obj" "$tmp/log"

cd "$REPO_ROOT"
mapfile -t sources < <(find "${DIRS[@]}" -maxdepth 1 -name '*.cc' | sort)
((${#sources[@]} > 0)) || { say "no sources found under ${DIRS[*]}"; exit 1; }

# The flags of the library's own build (CMakeLists.txt: C++20, -Wall -Wextra, warnings as errors
# in CI), at -O2 so that the warnings that need optimisation show too.
flags=(-std=c++20 "${mode[@]}" -Wall -Wextra -Werror -DNDEBUG -Iinclude -I.)
if [[ -n "${CKV_CROSS_FLAGS:-}" ]]; then
  read -r -a extra <<<"$CKV_CROSS_FLAGS"
  flags+=("${extra[@]}")
fi

# compile_one FILE FLAGS...: compiles FILE into $tmp/obj; on failure, or when it read a host
# header that is not a dependency's, leaves $tmp/log/<file>.failed beside the log that says why.
compile_one() {
  local f="$1" base
  shift
  base="$tmp/log/${f//\//_}"
  if ! "$CXX" "$@" -MD -MF "$base.d" -c "$f" -o "$tmp/obj/${f//\//_}.o" >"$base.log" 2>&1; then
    touch "$base.failed"
    return 0
  fi
  if [[ ! -s "$base.d" ]]; then
    echo "no dependency list from $CXX -MD" >>"$base.log"
    touch "$base.failed"
    return 0
  fi
  local stray
  stray="$(tr -s ' \\' '\n\n' <"$base.d" | grep '^/usr/include/' |
    grep -v -E '^/usr/include/(absl/|rocksdb/|liburing/|liburing\.h$|xxhash\.h$|xxh3\.h$|hiredis/)' |
    sort -u || true)"
  if [[ -n "$stray" ]]; then
    sed 's/^/host header that is not a dependency'"'"'s: /' <<<"$stray" >>"$base.log"
    touch "$base.failed"
  fi
}
export -f compile_one
export CXX tmp

# One compile per file, JOBS at a time.
printf '%s\n' "${sources[@]}" | xargs -P "$JOBS" -I{} bash -c 'compile_one "$@"' _ {} "${flags[@]}"

failed=0
for f in "${sources[@]}"; do
  base="$tmp/log/${f//\//_}"
  if [[ -e "$base.failed" ]]; then
    failed=$((failed + 1))
    say "FAILED: $f"
    sed 's/^/    /' "$base.log" >&2
  fi
done
seconds="$(awk -v s="$start_ns" -v e="$(date +%s%N)" 'BEGIN { printf "%.1f", (e - s) / 1e9 }')"
if ((failed > 0)); then
  say "$failed of ${#sources[@]} files failed for aarch64 ($CXX $mode_name), ${seconds} s"
  exit 1
fi
say "${#sources[@]} files compiled for aarch64 ($CXX $mode_name), ${seconds} s"
