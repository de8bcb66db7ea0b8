#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/put_steady_vs_fio.sh: ckv's Put throughput at steady state (a full, capped store where
# every Put evicts; put_bench --steady-state) as a fraction of the sequential write bandwidth fio
# measures on the same filesystem, in the same run.
#
#   bench/put_steady_vs_fio.sh [--dir DIR] [--model PRESET] [--tokens N] [--puts N] [--cap-puts K]
#                              [--rounds R] [--json FILE] [--build DIR] [--direct-writes]
#
# Each round runs, on DIR, alternating which goes first:
#   fio --name=seqwrite --ioengine=io_uring --direct=1 --bs=1M --rw=write --size=<N Puts' KV bytes>
#       --iodepth=16 --filename=DIR/fio.dat --output-format=json      (a new file: fio lays it out
#       with fallocate, and writes into unwritten extents)
#   the same fio again over the file it wrote (overwrite: allocated, written blocks; faster on
#       ext4 and XFS, which convert no extents), then DIR/fio.dat is deleted
#   put_bench --steady-state --store DIR --model PRESET --tokens N --puts N --cap-puts K --json
# and reports per round fio GB/s, the steady-state Put median GB/s and latency p50/p99/max, the
# ratios put/fio (new file) and put/fio-overwrite, and p99/median latency; then the median, min
# and max of each over the rounds. A store at steady state writes mostly over blocks the
# reclaimer freed without punching, so the overwrite ratio is the one that compares like with
# like; it is the stricter of the two here. The steady-state Put's targets are a ratio median
# >= 0.7 and p99 <= 3x the median latency.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/fio_common.sh
source "$REPO_ROOT/bench/fio_common.sh"
DIR="$PWD/ckv-put-steady-vs-fio"
MODEL=qwen2.5-0.5b
TOKENS=4096
PUTS=48
CAP_PUTS=8
ROUNDS=3
SETTLE_SECONDS=3
JSON=""
BUILD_DIR="$REPO_ROOT/build"
EXTRA=()

say() { printf 'put_steady_vs_fio: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

usage() {
  cat <<'USAGE'
Usage: bench/put_steady_vs_fio.sh [options]

Runs fio (io_uring, O_DIRECT, 1 MiB sequential writes, queue depth 16) and put_bench
--steady-state back to back on the same directory, R rounds, and prints put/fio ratios.

  --dir DIR       directory on the filesystem to measure (default ./ckv-put-steady-vs-fio)
  --model PRESET  model preset (default qwen2.5-0.5b)
  --tokens N      tokens per Put (default 4096)
  --puts N        Puts per steady-state run, warm-up included (default 48)
  --cap-puts K    prefixes the cap holds; the first K Puts are the warm-up (default 8)
  --rounds R      rounds of fio + put_bench (default 3)
  --settle S      seconds to wait, after a sync, before each timed run (default 3)
  --json FILE     write the rounds and the summary as one JSON object
  --build DIR     ckv build directory holding bench/put_bench (default <repo>/build)
  --direct-writes pass --direct-writes to put_bench (EngineOptions::put_direct_writes)
USAGE
}

while (($# > 0)); do
  case "$1" in
    --dir) DIR="${2:?--dir needs a value}"; shift 2 ;;
    --model) MODEL="${2:?--model needs a value}"; shift 2 ;;
    --tokens) TOKENS="${2:?--tokens needs a value}"; shift 2 ;;
    --puts) PUTS="${2:?--puts needs a value}"; shift 2 ;;
    --cap-puts) CAP_PUTS="${2:?--cap-puts needs a value}"; shift 2 ;;
    --rounds) ROUNDS="${2:?--rounds needs a value}"; shift 2 ;;
    --settle) SETTLE_SECONDS="${2:?--settle needs a value}"; shift 2 ;;
    --json) JSON="${2:?--json needs a value}"; shift 2 ;;
    --build) BUILD_DIR="${2:?--build needs a value}"; shift 2 ;;
    --direct-writes) EXTRA+=(--direct-writes); shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
for v in ROUNDS TOKENS PUTS CAP_PUTS; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--${v,,}: '${!v}' is not a positive integer"
done

PUT_BENCH="$BUILD_DIR/bench/put_bench"
[[ -x "$PUT_BENCH" ]] || die "$PUT_BENCH not found: build first (tools/ckv.sh build)"
command -v fio >/dev/null || die "fio not found (apt-get install fio, or tools/ckv.sh build)"
command -v python3 >/dev/null || die "python3 not found (needed to read the JSON)"

PUT_BYTES="$("$PUT_BENCH" --model "$MODEL" --tokens "$TOKENS" --print-bytes)"
FIO_BYTES=$((PUT_BYTES * (PUTS - CAP_PUTS)))

fio_setup_dir

say "$ROUNDS rounds on $DIR ($(df -PT "$DIR" | awk 'NR == 2 { print $2 " on " $1 }')): $PUTS Puts of $PUT_BYTES bytes, fio $FIO_BYTES bytes"

run_fio() {
  settle
  local pass
  for pass in new over; do
    fio_seq_write "$FIO_BYTES" "$WORK/fio-$pass-$1.json"
  done
  rm -f "$DIR/fio.dat"
}

run_put() {
  settle
  "$PUT_BENCH" --steady-state --store "$DIR" --model "$MODEL" --tokens "$TOKENS" --puts "$PUTS" \
    --cap-puts "$CAP_PUTS" ${EXTRA[@]+"${EXTRA[@]}"} --json "$WORK/put-$1.json" >"$WORK/put-$1.txt"
}

for ((round = 1; round <= ROUNDS; round++)); do
  if ((round % 2 == 1)); then
    say "round $round/$ROUNDS: fio, then put_bench --steady-state"
    run_fio "$round"
    run_put "$round"
  else
    say "round $round/$ROUNDS: put_bench --steady-state, then fio"
    run_put "$round"
    run_fio "$round"
  fi
done

python3 - "$WORK" "$ROUNDS" "$MODEL" "$TOKENS" "$PUTS" "$CAP_PUTS" "$FIO_BYTES" "$DIR" "$JSON" <<'PY'
import json, statistics, sys

work, rounds, model, tokens, puts, cap_puts, fio_bytes, directory, json_out = sys.argv[1:10]
rounds = int(rounds)
rows = []
def fio_gbps_of(path, r):
    with open(path) as f:
        job = json.load(f)["jobs"][0]
    if job.get("error", 0):
        sys.exit(f"put_steady_vs_fio: fio round {r} failed with error {job['error']}")
    return job["write"]["bw"] * 1024 / 1e9  # fio reports KiB/s

for r in range(1, rounds + 1):
    fio_gbps = fio_gbps_of(f"{work}/fio-new-{r}.json", r)
    fio_over_gbps = fio_gbps_of(f"{work}/fio-over-{r}.json", r)
    with open(f"{work}/put-{r}.json") as f:
        put = json.load(f)
    rows.append({"round": r, "fio_gbps": fio_gbps, "fio_overwrite_gbps": fio_over_gbps,
                 "put_median_gbps": put["median_gbps"],
                 "put_min_gbps": put["min_gbps"], "put_max_gbps": put["max_gbps"],
                 "uncapped_median_gbps": put["uncapped"]["median_gbps"],
                 "latency_p50_ms": put["latency_p50_ms"], "latency_p99_ms": put["latency_p99_ms"],
                 "latency_max_ms": put["latency_max_ms"],
                 "every_put_evicted": put["every_put_evicted"],
                 "ratio": put["median_gbps"] / fio_gbps if fio_gbps > 0 else 0.0,
                 "ratio_overwrite": put["median_gbps"] / fio_over_gbps
                                    if fio_over_gbps > 0 else 0.0,
                 "p99_over_p50": put["latency_p99_ms"] / put["latency_p50_ms"]
                                 if put["latency_p50_ms"] > 0 else 0.0})

print(f"Put at steady state vs fio: {model}, {tokens} tokens a Put, {puts} Puts "
      f"({cap_puts} warm-up), fio {int(fio_bytes) / 1e9:.3f} GB, on {directory}")
print(f"{'round':<6} {'fio GB/s':>9} {'fio over':>9} {'put GB/s':>9} {'uncapped':>9} "
      f"{'put/fio':>8} {'put/over':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99/p50':>8} "
      f"{'evicted':>8}")
for row in rows:
    print(f"{row['round']:<6} {row['fio_gbps']:>9.3f} {row['fio_overwrite_gbps']:>9.3f} "
          f"{row['put_median_gbps']:>9.3f} {row['uncapped_median_gbps']:>9.3f} "
          f"{row['ratio']:>8.3f} {row['ratio_overwrite']:>8.3f} {row['latency_p50_ms']:>8.1f} "
          f"{row['latency_p99_ms']:>8.1f} {row['latency_max_ms']:>8.1f} "
          f"{row['p99_over_p50']:>8.2f} {'all' if row['every_put_evicted'] else 'NOT ALL':>8}")

def summary(key):
    values = [row[key] for row in rows]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}

keys = ("fio_gbps", "fio_overwrite_gbps", "put_median_gbps", "uncapped_median_gbps", "ratio",
        "ratio_overwrite", "latency_p50_ms", "latency_p99_ms", "p99_over_p50")
s = {k: summary(k) for k in keys}
for key in keys:
    print(f"{key:<22} median {s[key]['median']:.3f}  min {s[key]['min']:.3f}  max {s[key]['max']:.3f}")

if json_out:
    with open(json_out, "w") as f:
        json.dump({"benchmark": "put_steady_vs_fio", "model": model, "tokens": int(tokens),
                   "puts": int(puts), "cap_puts": int(cap_puts), "fio_bytes": int(fio_bytes),
                   "dir": directory, "rounds": rows, "summary": s}, f, indent=2)
        f.write("\n")
PY
