#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tools/ckv.sh: the single entry point of ckv.
#
#   tools/ckv.sh test    install what is missing, build, run the whole test suite (ctest),
#                        compile the library for aarch64 (tools/cross_aarch64.sh), check the lock
#                        annotations with clang's -Wthread-safety (tools/thread_safety.sh), then
#                        run the suite again under AddressSanitizer + UndefinedBehaviorSanitizer,
#                        and under ThreadSanitizer
#   tools/ckv.sh sanitize  only the sanitizer runs
#   tools/ckv.sh fuzz      the libFuzzer targets for a bounded time (needs clang): the
#                          safetensors/JSON readers, and the RESP reader and remote chunk value
#   tools/ckv.sh demo    install what is missing, build kvctl and reprefill_bench (not the tests),
#                        run the demo on ./ckv-demo-store, then a short Re-Prefill benchmark on
#                        ./ckv-demo-bench-store
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
readonly ASAN_BUILD_DIR="$REPO_ROOT/build-asan"
readonly TSAN_BUILD_DIR="$REPO_ROOT/build-tsan"

# Debian packages the build, the tests and the benchmarks need. python3-torch runs the reference
# decoder (python/ckv_ref); libopenblas0-pthread gives it OpenBLAS in place of the reference BLAS,
# which trains it about 8 times slower.
readonly PACKAGES=(
  build-essential cmake ninja-build pkg-config
  liburing-dev librocksdb-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev libcli11-dev fio gnuplot-nox
  pybind11-dev python3-dev python3-numpy python3-torch libopenblas0-pthread
  libhiredis-dev redis-server redis-tools
)

say() { printf 'ckv.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# Phases: `phase NAME` ends the phase in progress and starts NAME; when the script exits (on
# success or at the first failure, which ends the script under set -e) it prints each phase's
# wall time, so that a slow suite says where its time went.
PHASE_NAME=""
PHASE_START=0
PHASES=()
phase() {
  phase_end
  PHASE_NAME="$1"
  PHASE_START=$SECONDS
  say "phase: $PHASE_NAME"
}
phase_end() {
  if [[ -n "$PHASE_NAME" ]]; then PHASES+=("$PHASE_NAME|$((SECONDS - PHASE_START))|${1:-}"); fi
  PHASE_NAME=""
}
print_phases() {
  local rc=$?
  phase_end "$( ((rc == 0)) || echo 'failed here')"
  ((${#PHASES[@]} > 0)) || return "$rc"
  local p name secs note
  say "time per phase:"
  for p in "${PHASES[@]}"; do
    IFS='|' read -r name secs note <<<"$p"
    printf 'ckv.sh:   %-36s %5d s  %s\n' "$name" "$secs" "$note" >&2
  done
  printf 'ckv.sh:   %-36s %5d s\n' "total" "$SECONDS" >&2
  return "$rc"
}

usage() {
  cat <<'EOF'
Usage: tools/ckv.sh COMMAND

Commands:
  test    install missing Debian packages, build into build/, run the whole suite with ctest;
          compile the library for aarch64 with g++-aarch64-linux-gnu (tools/cross_aarch64.sh;
          skipped, saying so, where that compiler cannot be installed); parse every C++ file of
          build/ with clang -fsyntax-only -Wthread-safety -Werror, so that an access to an
          ABSL_GUARDED_BY member without its lock fails (tools/thread_safety.sh; skipped, saying
          so, where clang cannot be installed); then build into build-asan/ with
          AddressSanitizer and UndefinedBehaviorSanitizer, and into build-tsan/ with
          ThreadSanitizer, and run the suite again in each (any report fails it; the TSan run
          leaves out the crash test, whose children it would only slow); then fuzzes for 30 s in
          all (as fuzz does); prints the time of each phase at the end, also when a phase fails
  sanitize  only the sanitizer runs of test
  fuzz    install missing Debian packages (with clang and libclang-rt-14-dev), build the
          libFuzzer targets into build-fuzz/ (the safetensors/JSON readers; the RESP reader and
          the remote chunk value's decoders) and run them for CKV_FUZZ_SECONDS in all
          (tests/fuzz/run_fuzz.sh); fails when it finds a crash, a sanitizer report or a leak
  demo    install missing Debian packages, build only kvctl and reprefill_bench (not the tests),
          then on a fresh store ./ckv-demo-store (in the current directory): kvctl init, put
          synthetic prefixes (one sharing chunks with another), ls, verify, and a summary of what
          it did; then a short Re-Prefill benchmark (bench/reprefill_bench: ckv against full, h2o,
          impress and ckv-paper on qwen2.5-7b, 4K-token prefixes, budgets 5%, 15% and 25%, one
          round) on ./ckv-demo-bench-store, kept between runs so that later demos skip populating
          it; prints the table and the plot's path
  build   install missing Debian packages and build into build/
  help    show this help

Environment:
  CI=true             build with warnings as errors (as CI does)
  CKV_WERROR=ON|OFF   choose warnings-as-errors yourself
  CKV_SKIP_INSTALL=1  do not check or install Debian packages
  CKV_SANITIZE=0      test: skip the sanitizer runs
  CKV_FUZZ=0          test: skip the fuzz run
  CKV_CROSS=0         test: skip the aarch64 cross compile
  CKV_THREAD_SAFETY=0 test: skip the clang -Wthread-safety check
  CKV_TSA_JOBS=N      parallel clang parses of that check (default 2)
  CKV_DEMO_STORE=DIR  where the demo makes its store (default ./ckv-demo-store)
  CKV_DEMO_BENCH_STORE=DIR  where the demo's benchmark keeps its store
                      (default ./ckv-demo-bench-store)
  CKV_FUZZ_SECONDS=N  how long to run the fuzzers, in all (default 120 for fuzz, 30 within
                      test; two thirds to the safetensors/JSON target, a third to the remote one)
EOF
}

# Installs the packages of PACKAGES (and any given as arguments) that dpkg does not list as
# installed, and only those.
install_packages() {
  local wanted=("${PACKAGES[@]}" "$@")
  if [[ "${CKV_SKIP_INSTALL:-0}" == 1 ]]; then
    say "skipping the package check (CKV_SKIP_INSTALL=1)"
    return
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    say "warning: dpkg-query not found (not Debian?); install these yourself: ${wanted[*]}"
    return
  fi
  local missing=() pkg
  for pkg in "${wanted[@]}"; do
    if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)" != installed ]]; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    say "all ${#wanted[@]} Debian packages are installed"
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

# build DIR DESCRIPTION [CMAKE ARGS...]: configures DIR with Ninja and builds all of it.
build_in() { build_targets_in "$1" "$2" "" "${@:3}"; }

# build_targets_in DIR DESCRIPTION TARGETS [CMAKE ARGS...]: configures DIR with Ninja and builds
# the space-separated TARGETS (and what they link), or everything when TARGETS is empty.
build_targets_in() {
  local dir="$1" what="$2" targets="$3"
  shift 3
  install_packages
  local werror="${CKV_WERROR:-}"
  if [[ -z "$werror" ]]; then
    if [[ "${CI:-}" == true ]]; then werror=ON; else werror=OFF; fi
  fi
  # A build tree made by another generator cannot be reused by Ninja: start it afresh.
  if [[ -f "$dir/CMakeCache.txt" ]] &&
    ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; then
    say "$(basename "$dir")/ was configured with another generator; reconfiguring it with Ninja"
    rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
  fi
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  say "configuring $(basename "$dir")/ ($what, Ninja, CKV_WERROR=$werror)"
  cmake -S "$REPO_ROOT" -B "$dir" -G Ninja -DCKV_WERROR="$werror" "$@" >&2
  local target_args=()
  if [[ -n "$targets" ]]; then
    read -r -a target_args <<<"$targets"
    target_args=(--target "${target_args[@]}")
    say "building ${targets} with $jobs jobs"
  else
    say "building with $jobs jobs"
  fi
  cmake --build "$dir" -j "$jobs" "${target_args[@]}" >&2
}

# The whole Release build, tests included (a demo may have configured build/ without them).
build() { build_in "$BUILD_DIR" Release -DCMAKE_BUILD_TYPE=Release -DCKV_BUILD_TESTS=ON; }

# Only what the demo runs: kvctl and reprefill_bench and the libraries they link. The tests are
# not configured (GoogleTest discovery and ckv_tests are most of a fresh build's time); a later
# build or test configures them again in the same build/.
build_demo() {
  build_targets_in "$BUILD_DIR" "Release, demo targets only" "kvctl reprefill_bench" \
    -DCMAKE_BUILD_TYPE=Release -DCKV_BUILD_TESTS=OFF -DCKV_BUILD_BENCH=ON
}

# What the machine let the suite cover (tests/engine/coverage_test.cc): where $TMPDIR refuses O_DIRECT
# or io_uring is disabled, the engine falls back quietly and the whole suite tests the fallback;
# the summary line says so.
coverage_of() {
  local line
  line="$("$1/tests/ckv_tests" --gtest_filter='CoverageTest.*' 2>/dev/null |
    grep '^ckv coverage:' || true)"
  if [[ -z "$line" ]]; then
    printf 'coverage unknown (CoverageTest did not run)'
  elif [[ "$line" == *"O_DIRECT NO"* || "$line" == *"io_uring NO"* ]]; then
    printf 'REDUCED COVERAGE: %s' "${line#ckv coverage: }"
  else
    printf 'O_DIRECT and io_uring covered'
  fi
}

# ctest_in DIR DESCRIPTION [CTEST ARGS...]
ctest_in() {
  local dir="$1" what="$2" rc=0 coverage
  shift 2
  say "running the test suite ($what)"
  coverage="$(coverage_of "$dir")"
  # ctest starts the tests it knows to be slow first, from the times of its last run in this
  # build tree; a fresh tree has none and would start them in declaration order, the scripted
  # tests (install, full disk, Python) last, each then running alone at the end of the pass.
  # tests/ctest_cost.txt seeds it with the times of the slow tests (the larger of the Release
  # and the TSan pass, in s); ctest keeps the file up to date from then on.
  local costs="$dir/Testing/Temporary/CTestCostData.txt"
  if [[ ! -f "$costs" ]]; then
    mkdir -p "$(dirname "$costs")"
    cp "$REPO_ROOT/tests/ctest_cost.txt" "$costs"
  fi
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -j2 "$@" || rc=$?
  if ((rc == 0)); then
    say "all tests passed ($what; $coverage)"
  else
    say "tests failed ($what, ctest exit $rc; $coverage)"
  fi
  return "$rc"
}

# sanitize_in DIR DESCRIPTION SANITIZERS: a -O1, line-tables-only build (about a third of the build
# time of -O2 -g) with the given -fsanitize= list and the debug invariant checks (CKV_DCHECK, see
# common/assert.h) on; benchmarks left out (the suite runs none of them when they are not built).
sanitize_in() {
  build_in "$1" "$2" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1" \
    -DCKV_SANITIZE="$3" -DCKV_BUILD_BENCH=OFF -DCKV_ENABLE_DCHECK=ON -DCKV_BUILD_TESTS=ON
}

# The suite again under AddressSanitizer (leaks included) + UndefinedBehaviorSanitizer, then
# under ThreadSanitizer (tests/tsan.supp says what it ignores in the uninstrumented libraries;
# common/tsan_absl_sync.cc makes absl::Mutex visible to it).
run_sanitized() {
  phase "build: ASan+UBSan (build-asan/)"
  sanitize_in "$ASAN_BUILD_DIR" "ASan+UBSan" address,undefined
  phase "ctest: ASan+UBSan"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest_in "$ASAN_BUILD_DIR" "ASan+UBSan"
  phase "build: TSan (build-tsan/)"
  sanitize_in "$TSAN_BUILD_DIR" "TSan" thread
  phase "ctest: TSan"
  # Left out of the TSan run: the crash matrix (CrashTest.*). Its SIGKILL cells race nothing in
  # the parent: the store's threads live in children that are killed mid-run, before TSan could
  # report at their exit, and a race across processes is invisible to it; TSan would only slow
  # each child's start and reopen several times over. Its power-loss cells run the same engine
  # code (and its threads) as the fault matrix and the load test, which do run under TSan.
  # CrashSeamTest.* (in process, deterministic) is not left out.
  # Also left out: the synthetic attention generator's tests (SyntheticAttentionTest.*). They
  # run one thread over the generator (tools/synthetic_attention.cc starts none), where TSan
  # can find no race, and took 180 s of the pass under its instrumentation (4 s in Release).
  # The Release and ASan+UBSan passes run them.
  # And the two scripted tests of the installed package and of a full file system (install_test,
  # full_disk_test: 42 s and 40 s of the pass, its two longest): what they check is packaging
  # and the kernel's ENOSPC on a real file system, which no thread interleaving changes; the
  # engine's threads under a full disk run under TSan in the fault tests (StoreFaultTest,
  # FaultMatrixTest), and the Release and ASan+UBSan passes run both scripts.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$REPO_ROOT/tests/tsan.supp" \
    ctest_in "$TSAN_BUILD_DIR" "TSan" \
    -E '^(CrashTest\.|SyntheticAttentionTest\.|install_test$|full_disk_test$)'
}

# The libFuzzer target is built by clang outside CMake (tests/fuzz/run_fuzz.sh), so the default
# build never needs clang.
# run_fuzz [SECONDS]: for CKV_FUZZ_SECONDS if set, else SECONDS (default 120).
run_fuzz() {
  install_packages clang libclang-rt-14-dev
  "$REPO_ROOT/tests/fuzz/run_fuzz.sh" "$REPO_ROOT/build-fuzz" "${CKV_FUZZ_SECONDS:-${1:-120}}"
}

# The library's sources checked for aarch64 (parsed, not compiled to objects: the cheaper mode),
# so that x86-only code outside its guards fails here (docs/kernels.md, Portability).
run_cross_aarch64() {
  # Best effort: a machine that cannot install the cross compiler skips this step, not the rest.
  (install_packages g++-aarch64-linux-gnu) ||
    say "warning: could not install g++-aarch64-linux-gnu"
  if ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1; then
    say "skipping the aarch64 cross compile: aarch64-linux-gnu-g++ is not installed" \
      "(Debian package g++-aarch64-linux-gnu)"
    return 0
  fi
  say "compiling the library for aarch64 (tools/cross_aarch64.sh)"
  "$REPO_ROOT/tools/cross_aarch64.sh" --syntax-only
}

# Every C++ file of build/ parsed by clang with -Wthread-safety (tools/thread_safety.sh): g++
# ignores the lock annotations, so only this checks them. It reads build/compile_commands.json,
# which the Release build has just written, so it needs no configure of its own.
run_thread_safety() {
  local cxx
  cxx="$(command -v clang++ || command -v clang++-14 || true)"
  if [[ -z "$cxx" ]]; then
    # Best effort, as for the cross compiler: a machine without clang skips this step only.
    (install_packages clang) || say "warning: could not install clang"
    cxx="$(command -v clang++ || command -v clang++-14 || true)"
  fi
  if [[ -z "$cxx" ]]; then
    say "skipping the thread-safety check: clang++ is not installed (Debian package clang)"
    return 0
  fi
  say "checking the lock annotations with clang -Wthread-safety (tools/thread_safety.sh)"
  CKV_TSA_CXX="$cxx" "$REPO_ROOT/tools/thread_safety.sh" "$BUILD_DIR"
}

run_tests() {
  phase "packages"
  install_packages
  phase "build: Release (build/)"
  build
  # The Python suites run only where cmake built the module; the set-up installs what it needs,
  # so a build without it is a broken set-up, not a smaller suite (CKV_PYTHON=0 accepts it).
  local registered
  registered="$(ctest --test-dir "$BUILD_DIR" -N -R '^reference_model_test$' || true)"
  if [[ "${CKV_PYTHON:-1}" != 0 && "$registered" != *reference_model_test* ]]; then
    die "the Python module was not built (see cmake's 'ckv:' lines in the build output), so" \
      "python_test and reference_model_test would not run; CKV_PYTHON=0 runs the rest without them"
  fi
  phase "ctest: Release"
  ctest_in "$BUILD_DIR" Release
  if [[ "${CKV_CROSS:-1}" != 0 ]]; then
    phase "cross compile: aarch64 (syntax)"
    run_cross_aarch64
  fi
  if [[ "${CKV_THREAD_SAFETY:-1}" != 0 ]]; then
    phase "thread-safety: clang -Wthread-safety"
    run_thread_safety
  fi
  if [[ "${CKV_SANITIZE:-1}" != 0 ]]; then run_sanitized; fi
  if [[ "${CKV_FUZZ:-1}" != 0 ]]; then
    phase "fuzz: build and run 30 s"
    run_fuzz 30
  fi
  phase_end
}

# The value of "key":NUMBER in one line of kvctl's JSON (kvctl writes no spaces).
json_number() {
  local key="$1" json="$2" value
  value="$(printf '%s' "$json" | grep -o "\"$key\":[0-9]*" | head -n1 | cut -d: -f2 || true)"
  printf '%s' "${value:-0}"
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

run_demo() {
  build_demo
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
  ((verify_rc == 0)) || return "$verify_rc"
  echo
  run_demo_bench
}

# A short Re-Prefill benchmark (docs/baselines.md); bench/reprefill_bench reuses its store when
# it matches the workload, so only the first demo populates it.
run_demo_bench() {
  local bench="$BUILD_DIR/bench/reprefill_bench"
  [[ -x "$bench" ]] || die "reprefill_bench was not built ($bench)"
  local store="${CKV_DEMO_BENCH_STORE:-$ORIG_PWD/ckv-demo-bench-store}"
  say "reprefill_bench: ckv against the baselines (qwen2.5-7b, 4096-token prefixes, 64-token suffixes)"
  "$bench" --store "$store" --model qwen2.5-7b --prefix-tokens 4096 --suffix-tokens 64 \
    --conversations 4 --turns 3 --budgets 5,25,90 --systems full,h2o,impress,ckv-paper,ckv \
    --gpu-tier-bytes 16M --cpu-tier-bytes 48M --rounds 1 --fidelity --fidelity-requests 1 \
    --fio-seconds 1 \
    --json "$store/reprefill.json" --plot "$store/reprefill.png"
  echo "  benchmark JSON  $store/reprefill.json"
}

main() {
  trap print_phases EXIT
  local cmd="${1:-help}"
  (($# > 0)) && shift
  (($# == 0)) || die "'$cmd' takes no arguments (got: $*)"
  cd "$REPO_ROOT"
  case "$cmd" in
    test) run_tests ;;
    sanitize) run_sanitized ;;
    fuzz) run_fuzz ;;
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
