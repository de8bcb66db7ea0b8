#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the safetensors/JSON fuzzer (tests/fuzz/safetensors_fuzz.cc) with clang++, libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer into BUILD_DIR/fuzz, and runs it for SECONDS
# seconds from the seed corpus tests/fuzz/corpus/ (new inputs it finds go to BUILD_DIR/fuzz/corpus,
# a crashing input to BUILD_DIR/fuzz/crash-*). Exits non-zero when the fuzzer finds anything.
#
# Needs the Debian packages clang and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes),
# besides the project's libabsl-dev, libxxhash-dev and pkg-config. The project's sources the
# target needs are compiled in directly, instrumented; Abseil and xxhash are linked as installed.
#
# Usage: tests/fuzz/run_fuzz.sh BUILD_DIR SECONDS
set -euo pipefail

if [[ $# -ne 2 || ! $2 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
readonly BUILD_DIR=$1
readonly SECONDS_TO_RUN=$2
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly REPO_ROOT
readonly OUT="$BUILD_DIR/fuzz"
readonly CXX_FUZZ=${CXX_FUZZ:-clang++}

if ! command -v "$CXX_FUZZ" >/dev/null; then
  echo "run_fuzz.sh: $CXX_FUZZ not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
mkdir -p "$OUT/corpus"

sources=(
  tests/fuzz/safetensors_fuzz.cc
  tools/json_reader.cc tools/safetensors.cc tools/safetensors_kv.cc tools/model_spec_json.cc
  common/model_spec.cc common/status.cc
)
# shellcheck disable=SC2207  # pkg-config prints space-separated flags
libs=($(pkg-config --cflags --libs absl_status absl_statusor absl_strings absl_str_format libxxhash))

echo "run_fuzz.sh: building $OUT/safetensors_fuzz" >&2
(cd "$REPO_ROOT" && "$CXX_FUZZ" -std=c++20 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Wall -Wextra -Werror -I include -I . "${sources[@]}" "${libs[@]}" \
  -o "$OUT/safetensors_fuzz")

echo "run_fuzz.sh: fuzzing for ${SECONDS_TO_RUN}s" >&2
# -rss_limit_mb: an input may make the reader allocate at most about its own size, so 2 GiB is a
# leak or a blow-up, not a big input. The first corpus directory receives new inputs.
"$OUT/safetensors_fuzz" -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 \
  -max_len=65536 -print_final_stats=1 -dict="$REPO_ROOT/tests/fuzz/safetensors.dict" \
  -artifact_prefix="$OUT/" "$OUT/corpus" "$REPO_ROOT/tests/fuzz/corpus"
