#!/usr/bin/env bash
# session 39, device call 1: issue 10's 16-core rows (items 1, 2, 3 tmpfs, 6) on main at the session's start.
set -u
R=$PWD; O=/tmp/o; mkdir -p $O
uptime
BENCH_ARGS="--workers 4,16 --sizes-mb 2,32 --total-mb 1024 --reps 8 --interleave --warm-loads --gateway-rows pieces,segments-shm" \
  timeout 330 benchmarks/device_matrix.sh $O/matrix $R
uptime
cd /tmp && PYTHONUNBUFFERED=1 timeout 180 python3 $R/benchmarks/bench_connector.py --l1 shm --workers 2 --sizes-mb 2 --total-mb 512 --reps 3 \
  --clients 1,2,4,8 --client-mb 512 --client-passes 4 --client-reference both --no-gateway --out $O/clients --label 16core-clients-shm-s39 > $O/clients.log 2>&1
echo "clients rc=$?"; grep -v INFO $O/clients.log | tail -n 25
uptime
tar czf $OUT/s39-run1.tgz -C $O .
