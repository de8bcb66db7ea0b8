#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/io_vs_fio.sh: the read engine's random-read bandwidth and CPU cost as a fraction of fio's,
# measured back to back on the same file.
#
#   bench/io_vs_fio.sh [--file F] [--file-size 2G] [--seconds 3] [--rounds 3]
#                      [--sizes 16K,32K,64K,256K] [--qds 32,64] [--run-io-size 32K]
#                      [--run-records 8] [--backend auto|uring|threads] [--build DIR] [--json FILE]
#
# For every size S and depth Q, each round runs
#   io_bench --file F --pattern random --io-size S --qd Q --seconds T --json
#   fio --name=randread --ioengine=io_uring --direct=1 --rw=randread --bs=S --iodepth=Q
#       --runtime=T --time_based --filename=F --output-format=json
# and for every Q, the runs pattern (--run-records adjacent records of --run-io-size, coalesced
# into one read of C = run-records x run-io-size bytes) against fio at --bs=C. The order of the
# two alternates between rounds. io_bench creates F on first use (O_DIRECT, so the page cache holds
# none of it; both tools read with O_DIRECT). For each configuration the script prints the median,
# min and max over R rounds of: io_bench MB/s, fio MB/s, their ratio, and CPU seconds per GB of
# both and their ratio. fio's CPU is usr_cpu + sys_cpu (percent of its job runtime) x runtime;
# io_bench's is getrusage user + system of the whole process (I/O thread included, checksums
# verified). --json writes every round and the summary as one JSON object.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FILE="$PWD/ckv-io-vs-fio/io.dat"
FILE_SIZE=2G
SECONDS_PER_RUN=3
ROUNDS=3
SIZES=16K,32K,64K,256K
QDS=32,64
RUN_IO_SIZE=32K
RUN_RECORDS=8
BACKEND=auto
BUILD_DIR="$REPO/build"
JSON=""

die() { printf 'io_vs_fio: %s\n' "$*" >&2; exit 2; }
say() { printf 'io_vs_fio: %s\n' "$*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --file) FILE="${2:?}"; shift 2 ;;
    --file-size) FILE_SIZE="${2:?}"; shift 2 ;;
    --seconds) SECONDS_PER_RUN="${2:?}"; shift 2 ;;
    --rounds) ROUNDS="${2:?}"; shift 2 ;;
    --sizes) SIZES="${2:?}"; shift 2 ;;
    --qds) QDS="${2:?}"; shift 2 ;;
    --run-io-size) RUN_IO_SIZE="${2:?}"; shift 2 ;;
    --run-records) RUN_RECORDS="${2:?}"; shift 2 ;;
    --backend) BACKEND="${2:?}"; shift 2 ;;
    --build) BUILD_DIR="${2:?}"; shift 2 ;;
    --json) JSON="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

IO_BENCH="$BUILD_DIR/bench/io_bench"
[[ -x "$IO_BENCH" ]] || die "$IO_BENCH not found (ninja -C $BUILD_DIR io_bench)"
command -v fio >/dev/null || die "fio not found"
command -v python3 >/dev/null || die "python3 not found (reads fio's JSON)"
mkdir -p "$(dirname "$FILE")"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

to_bytes() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))" "$1"; }

# Creates the file (and the checksum caches) before timing anything.
"$IO_BENCH" --file "$FILE" --file-size "$FILE_SIZE" --io-size "$RUN_IO_SIZE" --qd 1 --seconds 0.1 --json >/dev/null

RUN_BYTES=$(( $(to_bytes "$RUN_IO_SIZE") * RUN_RECORDS ))
CONFIGS=()
IFS=',' read -ra SIZE_LIST <<<"$SIZES"
IFS=',' read -ra QD_LIST <<<"$QDS"
for q in "${QD_LIST[@]}"; do
  for s in "${SIZE_LIST[@]}"; do CONFIGS+=("random:$(to_bytes "$s"):$q"); done
  CONFIGS+=("runs:$RUN_BYTES:$q")
done

run_ckv() {  # pattern bytes qd out
  local pattern=$1 bytes=$2 qd=$3 out=$4
  if [[ $pattern == random ]]; then
    "$IO_BENCH" --file "$FILE" --file-size "$FILE_SIZE" --pattern random --io-size "$bytes" --qd "$qd" \
      --seconds "$SECONDS_PER_RUN" --backend "$BACKEND" --json >"$out"
  else
    "$IO_BENCH" --file "$FILE" --file-size "$FILE_SIZE" --pattern runs --io-size "$RUN_IO_SIZE" \
      --run-records "$RUN_RECORDS" --qd "$qd" --seconds "$SECONDS_PER_RUN" --backend "$BACKEND" \
      --json >"$out"
  fi
}

run_fio() {  # bytes qd out
  fio --name=randread --ioengine=io_uring --direct=1 --rw=randread --bs="$1" --iodepth="$2" \
    --runtime="$SECONDS_PER_RUN" --time_based --filename="$FILE" --output-format=json >"$3"
}

for ((round = 1; round <= ROUNDS; round++)); do
  for cfg in "${CONFIGS[@]}"; do
    IFS=':' read -r pattern bytes qd <<<"$cfg"
    tag="$pattern-$bytes-$qd-$round"
    say "round $round/$ROUNDS: $pattern ${bytes}B qd $qd"
    if ((round % 2 == 1)); then
      run_ckv "$pattern" "$bytes" "$qd" "$WORK/ckv-$tag.json"; run_fio "$bytes" "$qd" "$WORK/fio-$tag.json"
    else
      run_fio "$bytes" "$qd" "$WORK/fio-$tag.json"; run_ckv "$pattern" "$bytes" "$qd" "$WORK/ckv-$tag.json"
    fi
  done
done

python3 - "$WORK" "$ROUNDS" "$JSON" "${CONFIGS[@]}" <<'EOF'
import json, statistics, sys
work, rounds, json_out, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def fio_stats(path):
    with open(path) as f:
        j = json.load(f)["jobs"][0]
    r = j["read"]
    runtime = j["job_runtime"] / 1000.0
    cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * runtime
    return r["bw_bytes"] / 1e6, cpu / (r["io_bytes"] / 1e9)
rows, summary = [], []
print(f"{'pattern':8} {'read size':>9} {'qd':>3} | {'ckv MB/s':>9} {'fio MB/s':>9} {'bw ratio (min-max)':>20} | "
      f"{'ckv s/GB':>8} {'fio s/GB':>8} {'cpu ratio (min-max)':>20}")
for cfg in configs:
    pattern, size, qd = cfg.split(":")
    ck, fi = [], []
    for r in range(1, rounds + 1):
        tag = f"{pattern}-{size}-{qd}-{r}"
        with open(f"{work}/ckv-{tag}.json") as f:
            c = json.load(f)
        fb, fc = fio_stats(f"{work}/fio-{tag}.json")
        ck.append((c["mb_per_s"], c["cpu_s_per_gb"]))
        fi.append((fb, fc))
        rows.append({"pattern": pattern, "read_bytes": int(size), "qd": int(qd), "round": r,
                     "ckv_mb_per_s": c["mb_per_s"], "ckv_cpu_s_per_gb": c["cpu_s_per_gb"],
                     "fio_mb_per_s": fb, "fio_cpu_s_per_gb": fc, "ckv": c})
    bw = [a[0] / b[0] for a, b in zip(ck, fi)]
    cpu = [a[1] / b[1] for a, b in zip(ck, fi)]
    med = statistics.median
    s = {"pattern": pattern, "read_bytes": int(size), "qd": int(qd),
         "ckv_mb_per_s": med([a[0] for a in ck]), "fio_mb_per_s": med([b[0] for b in fi]),
         "bw_ratio_median": med(bw), "bw_ratio_min": min(bw), "bw_ratio_max": max(bw),
         "ckv_cpu_s_per_gb": med([a[1] for a in ck]), "fio_cpu_s_per_gb": med([b[1] for b in fi]),
         "cpu_ratio_median": med(cpu), "cpu_ratio_min": min(cpu), "cpu_ratio_max": max(cpu)}
    s["bw_target_met"] = s["bw_ratio_median"] >= 0.9
    s["cpu_target_met"] = s["cpu_ratio_median"] <= 1.5
    summary.append(s)
    kib = f"{int(size)//1024}K"
    print(f"{pattern:8} {kib:>9} {qd:>3} | {s['ckv_mb_per_s']:9.0f} {s['fio_mb_per_s']:9.0f} "
          f"{s['bw_ratio_median']:6.3f} ({s['bw_ratio_min']:.3f}-{s['bw_ratio_max']:.3f}) | "
          f"{s['ckv_cpu_s_per_gb']:8.3f} {s['fio_cpu_s_per_gb']:8.3f} "
          f"{s['cpu_ratio_median']:6.3f} ({s['cpu_ratio_min']:.3f}-{s['cpu_ratio_max']:.3f})")
print(f"rounds: {rounds}; medians over rounds; targets: bw ratio >= 0.9, cpu ratio <= 1.5")
if json_out:
    with open(json_out, "w") as f:
        json.dump({"rounds": rows, "summary": summary}, f, indent=1)
EOF
