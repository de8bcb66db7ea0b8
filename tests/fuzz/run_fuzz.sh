#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the two fuzz targets with clang++, libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer into BUILD_DIR/fuzz, and runs them for SECONDS seconds in all: the
# safetensors/JSON reader (tests/fuzz/safetensors_fuzz.cc, two thirds of the time, from the seed
# corpus tests/fuzz/corpus/) and what a Redis Cluster node sends back, the RESP reader and the
# remote chunk value's decoders (tests/fuzz/remote_fuzz.cc, a third, from tests/fuzz/remote_corpus/).
# New inputs go to BUILD_DIR/fuzz/corpus and BUILD_DIR/fuzz/remote_corpus, a crashing input to
# BUILD_DIR/fuzz/crash-*. Exits non-zero when a fuzzer finds anything.
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
mkdir -p "$OUT/corpus" "$OUT/remote_corpus"

# shellcheck disable=SC2207  # pkg-config prints space-separated flags
libs=($(pkg-config --cflags --libs absl_status absl_statusor absl_strings absl_str_format \
  absl_flat_hash_map libxxhash))
build() {  # build NAME SOURCES...
  local name=$1
  shift
  echo "run_fuzz.sh: building $OUT/$name" >&2
  (cd "$REPO_ROOT" && "$CXX_FUZZ" -std=c++20 -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Werror -I include -I . "$@" "${libs[@]}" \
    -o "$OUT/$name")
}
build safetensors_fuzz tests/fuzz/safetensors_fuzz.cc \
  tools/json_reader.cc tools/safetensors.cc tools/safetensors_kv.cc tools/model_spec_json.cc \
  tools/output_file.cc common/printable.cc \
  common/model_spec.cc common/codec.cc common/status.cc
build remote_fuzz tests/fuzz/remote_fuzz.cc remote/resp_reader.cc remote/chunk_value.cc \
  remote/slot_map.cc common/model_spec.cc common/codec.cc common/chunk_key.cc common/status.cc \
  common/printable.cc

# -rss_limit_mb: an input may make a reader allocate at most about its own size, so 2 GiB is a
# leak or a blow-up, not a big input. The first corpus directory receives new inputs.
readonly REMOTE_SECONDS=$(( SECONDS_TO_RUN / 3 ))
echo "run_fuzz.sh: fuzzing the safetensors/JSON reader for $(( SECONDS_TO_RUN - REMOTE_SECONDS ))s" >&2
"$OUT/safetensors_fuzz" -max_total_time="$(( SECONDS_TO_RUN - REMOTE_SECONDS ))" -timeout=10 \
  -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -dict="$REPO_ROOT/tests/fuzz/safetensors.dict" \
  -artifact_prefix="$OUT/" "$OUT/corpus" "$REPO_ROOT/tests/fuzz/corpus"
echo "run_fuzz.sh: fuzzing the RESP reader and the remote chunk value for ${REMOTE_SECONDS}s" >&2
# The remote target runs with -malloc_limit_mb=64: what a node sends is read under limits of at
# most 16 MiB, so one allocation past 64 MiB is a size trusted from the wire.
"$OUT/remote_fuzz" -max_total_time="$REMOTE_SECONDS" -timeout=10 -rss_limit_mb=2048 \
  -malloc_limit_mb=64 \
  -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$OUT/" "$OUT/remote_corpus" "$REPO_ROOT/tests/fuzz/remote_corpus"
