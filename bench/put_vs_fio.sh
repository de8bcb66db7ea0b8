#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/put_vs_fio.sh: ckv's Put throughput as a fraction of the sequential write bandwidth that fio
# measures on the same filesystem, back to back in one run.
#
#   bench/put_vs_fio.sh [--dir DIR] [--model PRESET] [--tokens N] [--rounds R] [--json FILE]
#                       [--plot PNG] [--build DIR]
#
# Each round runs, on DIR:
#   fio --name=seqwrite --ioengine=io_uring --direct=1 --bs=1M --rw=write --size=<prefix bytes>
#       --iodepth=16 --filename=DIR/fio.dat --output-format=json      (then DIR/fio.dat is deleted)
#   put_bench --store DIR --model PRESET --tokens N --repeat 1        (a fresh store, then removed)
# alternating which of the two goes first from round to round, so that a drift of the device
# (write cache, thermal, background work) does not favour one of them. fio's write bandwidth
# (KiB/s) and put_bench's are both reported in GB/s (10^9 bytes). Prints one line per round and
# the ratio put/fio with its median, min and max; --json writes the same, --plot draws the rounds
# with gnuplot (when installed).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/fio_common.sh
source "$REPO_ROOT/bench/fio_common.sh"
DIR="$PWD/ckv-put-vs-fio"
MODEL=qwen2.5-7b
TOKENS=16384
ROUNDS=3
SETTLE_SECONDS=3
JSON=""
PLOT=""
BUILD_DIR="$REPO_ROOT/build"

say() { printf 'put_vs_fio: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

usage() {
  cat <<'EOF'
Usage: bench/put_vs_fio.sh [options]

Runs fio (io_uring, O_DIRECT, 1 MiB sequential writes, queue depth 16) and ckv's put_bench back
to back on the same directory, R rounds, and prints put/fio throughput ratios.

  --dir DIR       directory on the filesystem to measure (default ./ckv-put-vs-fio; created,
                  and removed afterwards when the script created it)
  --model PRESET  model preset of the prefix (default qwen2.5-7b)
  --tokens N      prefix length in tokens (default 16384, ~0.94 GB for qwen2.5-7b)
  --rounds R      rounds of fio + put (default 3)
  --settle S      seconds to wait, after a sync, before each timed run, so that the discards of
                  the previous run's deleted files (ext4 -o discard) finish first (default 3)
  --json FILE     write the rounds and the summary as one JSON object
  --plot PNG      draw GB/s per round for both with gnuplot (needs gnuplot)
  --build DIR     ckv build directory holding bench/put_bench (default <repo>/build)
EOF
}

while (($# > 0)); do
  case "$1" in
    --dir) DIR="${2:?--dir needs a value}"; shift 2 ;;
    --model) MODEL="${2:?--model needs a value}"; shift 2 ;;
    --tokens) TOKENS="${2:?--tokens needs a value}"; shift 2 ;;
    --rounds) ROUNDS="${2:?--rounds needs a value}"; shift 2 ;;
    --settle) SETTLE_SECONDS="${2:?--settle needs a value}"; shift 2 ;;
    --json) JSON="${2:?--json needs a value}"; shift 2 ;;
    --plot) PLOT="${2:?--plot needs a value}"; shift 2 ;;
    --build) BUILD_DIR="${2:?--build needs a value}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "--rounds: '$ROUNDS' is not a positive integer"
[[ "$TOKENS" =~ ^[1-9][0-9]*$ ]] || die "--tokens: '$TOKENS' is not a positive integer"

PUT_BENCH="$BUILD_DIR/bench/put_bench"
[[ -x "$PUT_BENCH" ]] || die "$PUT_BENCH not found: build first (tools/ckv.sh build)"
command -v fio >/dev/null || die "fio not found (apt-get install fio, or tools/ckv.sh build)"
command -v python3 >/dev/null || die "python3 not found (needed to read fio's JSON)"
if [[ -n "$PLOT" ]] && ! command -v gnuplot >/dev/null; then
  say "warning: gnuplot not found; no plot will be drawn"
  PLOT=""
fi

BYTES="$("$PUT_BENCH" --model "$MODEL" --tokens "$TOKENS" --print-bytes)"

fio_setup_dir

say "$ROUNDS rounds on $DIR ($(df -PT "$DIR" | awk 'NR == 2 { print $2 " on " $1 }')), $BYTES bytes each"

run_fio() {
  local round="$1"
  settle
  fio_seq_write "$BYTES" "$WORK/fio-$round.json"
  rm -f "$DIR/fio.dat"
}

run_put() {
  local round="$1"
  settle
  "$PUT_BENCH" --store "$DIR" --model "$MODEL" --tokens "$TOKENS" --repeat 1 \
    --json "$WORK/put-$round.json" >"$WORK/put-$round.txt"
}

for ((round = 1; round <= ROUNDS; round++)); do
  if ((round % 2 == 1)); then
    say "round $round/$ROUNDS: fio, then put_bench"
    run_fio "$round"
    run_put "$round"
  else
    say "round $round/$ROUNDS: put_bench, then fio"
    run_put "$round"
    run_fio "$round"
  fi
done

python3 - "$WORK" "$ROUNDS" "$MODEL" "$TOKENS" "$BYTES" "$DIR" "$JSON" "$PLOT" <<'PY'
import json, statistics, subprocess, sys

work, rounds, model, tokens, nbytes, directory, json_out, plot = sys.argv[1:9]
rounds, tokens, nbytes = int(rounds), int(tokens), int(nbytes)

rows = []
for r in range(1, rounds + 1):
    with open(f"{work}/fio-{r}.json") as f:
        fio = json.load(f)
    job = fio["jobs"][0]
    if job.get("error", 0):
        sys.exit(f"put_vs_fio: fio round {r} failed with error {job['error']}")
    fio_mbps = job["write"]["bw"] * 1024 / 1e6  # fio reports KiB/s
    with open(f"{work}/put-{r}.json") as f:
        put = json.load(f)
    put_gbps = put["runs"][0]["gbps"]
    rows.append({"round": r, "fio_mbps": fio_mbps, "fio_gbps": fio_mbps / 1e3,
                 "put_gbps": put_gbps, "put_seconds": put["runs"][0]["seconds"],
                 "put_bytes_written": put["runs"][0]["bytes_written"],
                 "ratio": put_gbps / (fio_mbps / 1e3) if fio_mbps > 0 else 0.0})

print(f"Put vs fio: {model}, {tokens} tokens, {nbytes / 1e9:.3f} GB per run, on {directory}")
print(f"{'round':<6} {'fio GB/s':>9} {'put GB/s':>9} {'put/fio':>8}")
for row in rows:
    print(f"{row['round']:<6} {row['fio_gbps']:>9.3f} {row['put_gbps']:>9.3f} {row['ratio']:>8.3f}")

def summary(key):
    values = [row[key] for row in rows]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}

s = {k: summary(k) for k in ("fio_gbps", "put_gbps", "ratio")}
for key, label in (("fio_gbps", "fio GB/s"), ("put_gbps", "put GB/s"), ("ratio", "put/fio")):
    print(f"{label:<9} median {s[key]['median']:.3f}  min {s[key]['min']:.3f}  max {s[key]['max']:.3f}")

if json_out:
    with open(json_out, "w") as f:
        json.dump({"benchmark": "put_vs_fio", "model": model, "tokens": tokens, "bytes": nbytes,
                   "dir": directory,
                   "fio_command": "fio --name=seqwrite --ioengine=io_uring --direct=1 --bs=1M "
                                  f"--rw=write --size={nbytes} --iodepth=16 "
                                  "--filename=DIR/fio.dat --output-format=json",
                   "rounds": rows, "summary": s}, f, indent=2)
        f.write("\n")

if plot:
    data = f"{work}/rounds.dat"
    with open(data, "w") as f:
        for row in rows:
            f.write(f"{row['round']} {row['fio_gbps']} {row['put_gbps']} {row['ratio']}\n")
    script = f"""
set terminal pngcairo size 800,480 noenhanced
set output '{plot}'
set title 'ckv Put vs fio sequential write ({model}, {tokens} tokens, {nbytes / 1e9:.2f} GB)'
set xlabel 'round'
set ylabel 'GB/s'
set yrange [0:*]
set xtics 1
set y2label 'put/fio'
set y2range [0:1.5]
set y2tics
set ytics nomirror
set key bottom right
set grid ytics
plot '{data}' using 1:2 axes x1y1 with linespoints title 'fio io_uring direct bs=1M qd=16 (GB/s)', \\
     '{data}' using 1:3 axes x1y1 with linespoints title 'ckv Put, put_bench (GB/s)', \\
     '{data}' using 1:4 axes x1y2 with linespoints dashtype 2 title 'put/fio (right axis)'
"""
    result = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    if result.returncode != 0:
        sys.stderr.write("put_vs_fio: gnuplot failed: " + result.stderr)
    else:
        sys.stderr.write(f"put_vs_fio: plot written to {plot}\n")
PY
