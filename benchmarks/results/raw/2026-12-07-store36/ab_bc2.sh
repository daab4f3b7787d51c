#!/bin/bash
# ABBA of bench_connector: A = main's package (/tmp/s36/maintree), B = store36; args: dir tag outdir
for order in A B B A; do
  if [ $order = A ]; then T=/tmp/s36/maintree; else T=/work/wt-store36; fi
  echo "== $order $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')"
  flock /work/bench.lock python $T/benchmarks/bench_connector.py --dir $1 --sizes-mb 0.25 --workers 2 --no-gateway --total-mb 256 --reps 3 --out $3/$2-$order-$(date +%H%M%S) > $3/$2-$order-$(date +%H%M%S).log 2>&1
  grep -h "0.25 MiB" $3/$2-$order-*/*.md | tail -0
done
