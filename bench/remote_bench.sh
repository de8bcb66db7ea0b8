#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/remote_bench.sh: runs bench/remote_bench against a throwaway Redis Cluster on loopback.
#
#   bench/remote_bench.sh [--build DIR] [--masters N] [-- REMOTE_BENCH_ARGS...]
#
# Starts N (default 3) redis-server masters on free loopback ports with cluster-enabled yes and
# no persistence (their files in a temporary directory), joins them with
# `redis-cli --cluster create`, waits for cluster_state:ok, runs
#   remote_bench --remote 127.0.0.1:<first port> --dir <tmp>/stores REMOTE_BENCH_ARGS...
# (Re-Prefill cold from the cluster against local NVMe; the client's GET throughput against
# redis-benchmark on the same cluster), and stops the servers and removes the directory on every
# exit path. The stores go to $TMPDIR (or /tmp): put TMPDIR on the NVMe you mean to measure.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="$REPO_ROOT/build"
MASTERS=3
while (($# > 0)); do
  case "$1" in
    --build) BUILD_DIR="$2"; shift 2 ;;
    --masters) MASTERS="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '3,14p' "$0"; exit 0 ;;
    *) echo "remote_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "remote_bench.sh: $tool not found (apt-get install redis-server redis-tools)" >&2; exit 3; }
done
BENCH="$BUILD_DIR/bench/remote_bench"
[[ -x "$BENCH" ]] || { echo "remote_bench.sh: $BENCH not built" >&2; exit 3; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ckv-remote-bench-XXXXXX")"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# A port p with p and p + 10000 (the cluster bus) free.
free_port() {
  python3 - <<'PY'
import socket
for _ in range(100):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p + 10000 > 65535: continue
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p + 10000)); t.close(); print(p); break
    except OSError:
        t.close()
PY
}

ADDRS=()
for ((i = 0; i < MASTERS; i++)); do
  port="$(free_port)"
  redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$WORK/nodes-$port.conf" --dir "$WORK" --save '' --appendonly no \
    --logfile "$WORK/redis-$port.log" --protected-mode no --daemonize no &
  PIDS+=("$!")
  ADDRS+=("127.0.0.1:$port")
done
for addr in "${ADDRS[@]}"; do
  for _ in $(seq 100); do redis-cli -p "${addr##*:}" PING 2>/dev/null | grep -q PONG && break; sleep 0.05; done
done
redis-cli --cluster create "${ADDRS[@]}" --cluster-yes >"$WORK/create.log" 2>&1 ||
  { cat "$WORK/create.log" >&2; exit 3; }
for addr in "${ADDRS[@]}"; do
  for _ in $(seq 400); do
    redis-cli -p "${addr##*:}" CLUSTER INFO | grep -q cluster_state:ok && break; sleep 0.05
  done
done
echo "remote_bench.sh: cluster of $MASTERS masters at ${ADDRS[*]}" >&2
"$BENCH" --remote "${ADDRS[0]}" --dir "$WORK/stores" "$@"
