# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# bench/fio_common.sh: what the benchmarks that compare a ckv write with fio on one directory
# share (sourced by put_vs_fio.sh and put_steady_vs_fio.sh; not run on its own).
#
#   fio_setup_dir        creates $DIR when missing (and removes it at exit when it did), makes it
#                        absolute, and makes $WORK, a scratch directory removed at exit together
#                        with $DIR/fio.dat and the put_bench stores in $DIR
#   settle               syncs $DIR and waits $SETTLE_SECONDS before a timed run
#   fio_seq_write BYTES OUT_JSON
#                        fio, io_uring, O_DIRECT, 1 MiB sequential writes at queue depth 16, of
#                        BYTES into $DIR/fio.dat (which it leaves in place), JSON to OUT_JSON

fio_setup_dir() {
  CREATED_DIR=0
  if [[ ! -d "$DIR" ]]; then
    mkdir -p "$DIR"
    CREATED_DIR=1
  fi
  DIR="$(cd "$DIR" && pwd)"
  WORK="$(mktemp -d)"
  trap fio_cleanup EXIT
}

fio_cleanup() {
  rm -f "$DIR/fio.dat"
  rm -rf "$DIR"/put-bench-*
  if ((CREATED_DIR)); then rmdir "$DIR" 2>/dev/null || true; fi
  rm -rf "$WORK"
}

# Lets the device go quiet before a timed run. A file system mounted with online discard (ext4
# -o discard) sends the freed blocks of the previous run's deleted file to the device after the
# deletion; those discards would otherwise land inside the next timed run, of either tool.
settle() {
  sync -f "$DIR"
  sleep "$SETTLE_SECONDS"
}

fio_seq_write() {
  fio --name=seqwrite --ioengine=io_uring --direct=1 --bs=1M --rw=write --size="$1" \
    --iodepth=16 --filename="$DIR/fio.dat" --output-format=json >"$2"
}
