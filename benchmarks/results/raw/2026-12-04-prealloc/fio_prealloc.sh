#!/bin/bash
# Issue 10 items 3/4 on disk, brief prealloc step 1: first-fill O_DIRECT writes into
# (a) a sparse file (ftruncate), (b) a fallocate'd file (unwritten extents), (c) a file written once;
# 2 psync jobs, each writing its own half sequentially (a card's workers fill regions apart).
# Three rounds, order rotated each round. Run under flock /work/bench.lock.
set -u
D=${D:-/var/tmp/prealloc-fio}
SIZE=${SIZE:-4G}
mkdir -p "$D"
run() {  # kind bs
  local kind=$1 bs=$2 f=$D/img
  rm -f "$f"
  case $kind in
    sparse) truncate -s "$SIZE" "$f" ;;
    falloc) fallocate -l "$SIZE" "$f" ;;
    written) fallocate -l "$SIZE" "$f"; fio --name=w --filename="$f" --rw=write --bs=2M --direct=1 --size="$SIZE" \
               --ioengine=psync --output-format=terse >/dev/null ;;
  esac
  echo "== $kind bs=$bs $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg) blocks before: $(stat -c %b "$f")"
  fio --name="$kind-$bs" --filename="$f" --rw=write --bs="$bs" --direct=1 --ioengine=psync --numjobs=2 \
      --size=$(( $(numfmt --from=iec $SIZE) / 2 )) --offset_increment=$(( $(numfmt --from=iec $SIZE) / 2 )) \
      --group_reporting --end_fsync=0 | grep -E "WRITE:|clat \(|lat \(usec\)|lat \(msec\)|cpu|^  *write:"
  echo "filefrag: $(filefrag "$f" | sed 's/.*: //')"
  rm -f "$f"
}
for r in 1 2 3; do
  case $r in 1) order="sparse falloc written" ;; 2) order="written falloc sparse" ;; 3) order="falloc sparse written" ;; esac
  for bs in 2M 256k; do for k in $order; do run $k $bs; done; done
done
