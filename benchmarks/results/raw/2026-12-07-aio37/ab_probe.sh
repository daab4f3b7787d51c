#!/bin/bash
# ABBA in one build (the aio37 tree): A = ADP_CARD_AIO=0, B = AIO. args: passed to probe_store_sync.py
D=/work/wt-aio37/benchmarks/results/raw/2026-12-07-aio37
cd /work/wt-aio37
for order in A B B A; do
  if [ $order = A ]; then export ADP_CARD_AIO=0; else unset ADP_CARD_AIO; fi
  echo "$order $(git log --oneline -1 | cut -c1-7) $(uptime | sed 's/.*load/load/')"
  python benchmarks/probe_store_sync.py "$@" --out $D/probe-$order-$(date +%H%M%S).json 2>&1 | grep -v INFO
done
