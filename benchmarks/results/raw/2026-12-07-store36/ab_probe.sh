#!/bin/bash
# ABBA of the probe: A = main's package (tree /tmp/s36/maintree), B = store36; args: dir reps tag
for order in A B B A; do
  if [ $order = A ]; then T=/tmp/s36/maintree; else T=/work/wt-store36; fi
  echo "== $order $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')"
  flock /work/bench.lock python $T/benchmarks/probe_store_sync.py --dir $1 --sizes-mb 0.25 --workers 2 --keys-per-worker 2 --total-mb 256 --reps $2 --out /tmp/s36/probe_$3_$order_$(date +%s).json 2>&1 | grep -v INFO
done
