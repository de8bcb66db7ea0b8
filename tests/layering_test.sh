#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/layering_test.sh: fails on an include that points the wrong way (docs/architecture.md,
# "Which folder may include which": dependencies point one way). Reads the #include "..." lines
# of every source file under the ckv folders and checks each against the rules of its folder;
# prints file:line, the include and the rule for each breach.
#
#   include/ckv/  includes only include/ckv/.
#   common/       the implementations of the public value types: the value headers only.
#   io/, kernels/  the public value headers and common/; nothing of engine, sessions or the
#                 Engine API.
#   storage/      what io/ may, and io/.
#   prefetch/     what storage/ may, and storage/.
#   remote/       what storage/ may, and storage/ (the shared tier on Redis Cluster).
#   engine/       any public header, prefetch/, remote/, storage/, io/, kernels/, common/.
#   tools/, bench/  the public API, their own headers (bench/ also tools/), kernels/ (the compute
#                 functions the tools and benchmarks run), engine/internal.h (the named internal
#                 API of the benchmark harness), common/status_macros.h (the status helpers),
#                 common/assert.h (CKV_CHECK: the one way a program stops on a broken
#                 invariant), and the exceptions listed below by file.
#   python/       the Python module: the public API, as any program that links ckv::ckv, and
#                 common/status_macros.h.
#
# Usage: tests/layering_test.sh [source root]   (default: the repository this script is in)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"

# The plain value types of the public API: no Engine, no session, no options.
value_headers="ckv/chunk_key.h ckv/model_spec.h ckv/status.h ckv/log.h ckv/kv.h \
ckv/record_layout.h ckv/reports.h ckv/io_backend.h ckv/virtual_tokens.h ckv/codec.h \
ckv/stats.h"

# Files of tools/ and bench/ that reach a lower layer directly, each with its reason.
declare -A exceptions=(
  # io_bench measures the I/O layer itself against fio.
  ["bench/io_bench.cc io/file_system.h"]=1
  ["bench/io_bench.cc prefetch/read_engine.h"]=1
  # kvctl's catalog inspection reads the catalog directly; its tier report sizes the summary
  # share of the CPU tier; its --format prom writes the store's figures with the engine's own
  # Prometheus writer, so that they carry the names Engine::Metrics() gives them.
  ["tools/kvctl/import_export.cc storage/catalog.h"]=1
  ["tools/kvctl/stats.cc engine/tier_cache.h"]=1
  ["tools/kvctl/stats.cc engine/metrics.h"]=1
  # index_bench writes the catalog of a store of millions of chunks directly, in large batches,
  # rather than Putting each chunk.
  ["bench/index_bench.cc storage/catalog.h"]=1
  # remote_bench measures the cluster client itself against redis-benchmark, with values of the
  # size the tier's value format gives a chunk.
  ["bench/remote_bench.cc remote/cluster_client.h"]=1
  ["bench/remote_bench.cc remote/chunk_value.h"]=1
  # The Re-Prefill baselines verify their own files (the key file, impress.bin) with the
  # checksum every record of the store uses.
  ["bench/reprefill/baseline.cc storage/record_checksum.h"]=1
  ["bench/reprefill/store.cc storage/record_checksum.h"]=1
  ["bench/reprefill/system_impress.cc storage/record_checksum.h"]=1
  # gpu_check checks the CUDA tier itself: a TierManager over the CUDA DeviceMemory.
  ["bench/gpu_check.cc engine/tier_cache.h"]=1
)

in_list() {  # in_list WORD LIST...
  local w="$1"; shift
  for x in "$@"; do [[ "$x" == "$w" ]] && return 0; done
  return 1
}

# allowed FILE FOLDER INCLUDE -> 0 when FILE (in FOLDER) may include INCLUDE; sets $rule.
allowed() {
  local file="$1" folder="$2" inc="$3" top="${3%%/*}"
  case "$top" in
    ckv|common|io|storage|kernels|prefetch|remote|engine|tools|bench) ;;
    *) return 0 ;;  # a third-party header (absl/, rocksdb/, ...)
  esac
  case "$folder" in
    include)
      rule="include/ckv/ includes only include/ckv/"
      [[ "$top" == ckv ]] ;;
    common)
      rule="common/ includes only the public value headers and common/"
      [[ "$top" == common ]] || in_list "$inc" $value_headers ;;
    io|kernels)
      rule="$folder/ includes only $folder/, common/ and the public value headers ($value_headers)"
      [[ "$top" == "$folder" || "$top" == common ]] || in_list "$inc" $value_headers ;;
    storage)
      rule="storage/ includes only storage/, io/, common/ and the public value headers"
      [[ "$top" == storage || "$top" == io || "$top" == common ]] ||
        in_list "$inc" $value_headers ;;
    prefetch|remote)
      rule="$folder/ includes only $folder/, storage/, io/, common/ and the public value headers"
      [[ "$top" == "$folder" || "$top" == storage || "$top" == io || "$top" == common ]] ||
        in_list "$inc" $value_headers ;;
    engine)
      rule="engine/ includes only the public API, engine/, prefetch/, remote/, storage/, io/, kernels/, common/"
      [[ "$top" != tools && "$top" != bench ]] ;;
    python)
      rule="python/ includes only the public API (include/ckv/) and common/status_macros.h"
      [[ "$top" == ckv || "$inc" == common/status_macros.h ]] ;;
    tools|bench)
      rule="$folder/ includes only the public API, its own headers, kernels/, engine/internal.h, common/status_macros.h and common/assert.h"
      [[ "$top" == ckv || "$top" == "$folder" || "$top" == kernels ]] && return 0
      [[ "$folder" == bench && "$top" == tools ]] && return 0
      [[ "$inc" == engine/internal.h || "$inc" == common/status_macros.h ||
        "$inc" == common/assert.h ]] && return 0
      [[ -n "${exceptions["$file $inc"]:-}" ]] ;;
    *) return 0 ;;
  esac
}

failures=0
checked=0
while IFS= read -r file; do
  folder="${file%%/*}"
  checked=$((checked + 1))
  while IFS=: read -r line text; do
    inc="$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$text")"
    rule=""
    if ! allowed "$file" "$folder" "$inc"; then
      echo "$file:$line: #include \"$inc\": $rule"
      failures=$((failures + 1))
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" || true)
done < <(find include common io storage kernels prefetch remote engine tools bench python \
           -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) 2>/dev/null | sort)

if ((checked == 0)); then
  echo "layering_test: no source files found under $root" >&2
  exit 1
fi
if ((failures > 0)); then
  echo "layering_test: $failures include(s) point the wrong way (rules: tests/layering_test.sh)"
  exit 1
fi
echo "layering_test: $checked files, every include points down"
