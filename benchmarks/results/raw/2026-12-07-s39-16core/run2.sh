#!/usr/bin/env bash
# session 39, device call 2 (machine warm from call 1, main installed there): item 3 on the host's local disk,
# 256 KiB and 2 MiB, 2 and 4 workers, two rounds (bench_connector's medium = O_DIRECT pwritev/preadv threads).
set -u
R=$PWD; O=/tmp/o2; mkdir -p $O; D=/var/tmp/adp39; mkdir -p $D; cd /tmp
for r in 1 2; do
  uptime
  PYTHONUNBUFFERED=1 timeout 200 python3 $R/benchmarks/bench_connector.py --dir $D --workers 2,4 --sizes-mb 0.25,2 --total-mb 1024 --reps 3 --no-gateway --out $O --label 16core-disk-r$r > $O/disk-r$r.log 2>&1
  echo "round $r rc=$?"; grep -E "^\| [0-9.]+ MiB \| [0-9]+ \| (medium|embedded)" $O/*disk-r$r.md
done
uptime; rm -rf $D
tar czf $OUT/s39-run2.tgz -C $O .
