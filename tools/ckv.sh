#!/usr/bin/env bash
# tools/ckv.sh: the single entry point of ckv.
#
#   tools/ckv.sh test    install what is missing, build, run the whole test suite (ctest)
#   tools/ckv.sh demo    install what is missing, build, run the demo on ./ckv-demo-store
#   tools/ckv.sh build   install what is missing, build
#   tools/ckv.sh help    this text
#
# Works from any directory (the build goes to <repo>/build); the demo store is made in the
# directory the script is run from. Warnings are errors (-DCKV_WERROR=ON) when CI=true, so CI
# keeps the code warning-free while a user's newer compiler cannot break their build; set
# CKV_WERROR=ON or OFF to choose yourself. CKV_SKIP_INSTALL=1 skips the package step.
set -euo pipefail

readonly ORIG_PWD="$PWD"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO_ROOT
readonly BUILD_DIR="$REPO_ROOT/build"

# Debian packages the build, the tests and the benchmarks need.
readonly PACKAGES=(
  build-essential cmake ninja-build pkg-config
  liburing-dev librocksdb-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev fio gnuplot-nox
)

say() { printf 'ckv.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

usage() {
  cat <<'EOF'
Usage: tools/ckv.sh COMMAND

Commands:
  test    install missing Debian packages, build into build/, run the whole suite with ctest
  demo    install missing Debian packages, build, then on a fresh store ./ckv-demo-store (in the
          current directory): kvctl init, put synthetic prefixes (one sharing chunks with
          another), ls, verify, and a summary of what it did
  build   install missing Debian packages and build into build/
  help    show this help

Environment:
  CI=true             build with warnings as errors (as CI does)
  CKV_WERROR=ON|OFF   choose warnings-as-errors yourself
  CKV_SKIP_INSTALL=1  do not check or install Debian packages
  CKV_DEMO_STORE=DIR  where the demo makes its store (default ./ckv-demo-store)
EOF
}

# Installs the packages of PACKAGES that dpkg does not list as installed, and only those.
install_packages() {
  if [[ "${CKV_SKIP_INSTALL:-0}" == 1 ]]; then
    say "skipping the package check (CKV_SKIP_INSTALL=1)"
    return
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    say "warning: dpkg-query not found (not Debian?); install these yourself: ${PACKAGES[*]}"
    return
  fi
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)" != installed ]]; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    say "all ${#PACKAGES[@]} Debian packages are installed"
    return
  fi
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null 2>&1 ||
      die "missing packages (${missing[*]}) and not root, and sudo is not available"
    sudo=(sudo)
  fi
  say "installing missing packages: ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

build() {
  install_packages
  local werror="${CKV_WERROR:-}"
  if [[ -z "$werror" ]]; then
    if [[ "${CI:-}" == true ]]; then werror=ON; else werror=OFF; fi
  fi
  # A build tree made by another generator cannot be reused by Ninja: start it afresh.
  if [[ -f "$BUILD_DIR/CMakeCache.txt" ]] &&
    ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$BUILD_DIR/CMakeCache.txt"; then
    say "build/ was configured with another generator; reconfiguring it with Ninja"
    rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
  fi
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  say "configuring build/ (Release, Ninja, CKV_WERROR=$werror)"
  cmake -S "$REPO_ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCKV_WERROR="$werror" >&2
  say "building with $jobs jobs"
  cmake --build "$BUILD_DIR" -j "$jobs" >&2
}

run_tests() {
  build
  say "running the test suite"
  local rc=0
  ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j2 || rc=$?
  if ((rc == 0)); then say "all tests passed"; else say "tests failed (ctest exit $rc)"; fi
  return "$rc"
}

# The value of "key":NUMBER in one line of kvctl's JSON (kvctl writes no spaces).
json_number() {
  local key="$1" json="$2" value
  value="$(printf '%s' "$json" | grep -o "\"$key\":[0-9]*" | head -n1 | cut -d: -f2 || true)"
  printf '%s' "${value:-0}"
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

run_demo() {
  build
  local kvctl="$BUILD_DIR/tools/kvctl"
  [[ -x "$kvctl" ]] || die "kvctl was not built ($kvctl)"
  local store="${CKV_DEMO_STORE:-$ORIG_PWD/ckv-demo-store}"
  if [[ -e "$store" ]]; then
    say "removing the previous demo store $store"
    rm -rf -- "$store"
  fi

  say "kvctl init: a store capped at 1 GiB"
  "$kvctl" init "$store" --max-disk-bytes 1G
  echo

  say "kvctl put: a small-model prefix, 2048 tokens"
  "$kvctl" put "$store" --model qwen2.5-0.5b --tokens 2048 --seed 1
  echo
  say "kvctl put: turn 1 of a conversation on qwen2.5-7b, 4096 tokens"
  "$kvctl" put "$store" --model qwen2.5-7b --tokens 4096 --seed 7
  echo
  say "kvctl put: turn 2 of the same conversation, 5120 tokens whose first 4096 are turn 1's"
  "$kvctl" put "$store" --model qwen2.5-7b --tokens 5120 --seed 8 \
    --shared-tokens 4096 --shared-seed 7
  echo

  say "kvctl ls"
  "$kvctl" ls "$store"
  echo

  say "kvctl verify --synthetic: read back every record, check checksums and contents"
  local verify_rc=0
  "$kvctl" verify "$store" --synthetic || verify_rc=$?
  echo

  local ls_json verify_json
  ls_json="$("$kvctl" ls "$store" --json)"
  verify_json="$("$kvctl" verify "$store" --json 2>/dev/null || true)"
  local written dedup bytes used records
  written="$(json_number chunks_written "$ls_json")"
  dedup="$(json_number chunks_deduplicated "$ls_json")"
  bytes="$(json_number bytes_written "$ls_json")"
  used="$(json_number disk_bytes_used "$ls_json")"
  records="$(json_number records_checked "$verify_json")"

  echo "Demo summary"
  echo "  store           $store"
  echo "  puts            3 prefixes (qwen2.5-0.5b 2048 tokens; qwen2.5-7b 4096 and 5120 tokens)"
  echo "  bytes written   $(mib "$bytes") in $written chunks; disk used $(mib "$used") of a 1 GiB cap"
  echo "  dedup           $dedup chunks were already stored and not written again"
  echo "                  (turn 2 reused the 256 chunks of turn 1 and wrote only its last 64)"
  if ((verify_rc == 0)); then
    echo "  verify          clean: $records records read back, checksums and contents match"
  else
    echo "  verify          FAILED (kvctl verify exit $verify_rc): see the problems listed above"
  fi
  return "$verify_rc"
}

main() {
  local cmd="${1:-help}"
  (($# > 0)) && shift
  (($# == 0)) || die "'$cmd' takes no arguments (got: $*)"
  cd "$REPO_ROOT"
  case "$cmd" in
    test) run_tests ;;
    demo) run_demo ;;
    build) build ;;
    help | -h | --help) usage ;;
    *)
      usage >&2
      die "unknown command '$cmd'"
      ;;
  esac
}

main "$@"
