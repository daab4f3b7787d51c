#!/bin/bash
# bench_connector ABBA in one build (the aio37 tree), each run under its own flock: A = ADP_CARD_AIO=0, B = AIO.
D=/work/wt-aio37/benchmarks/results/raw/2026-12-07-aio37
cd /work/wt-aio37
for order in A B B A; do
  if [ $order = A ]; then export ADP_CARD_AIO=0; else unset ADP_CARD_AIO; fi
  echo "$order $(git log --oneline -1 | cut -c1-7) $(uptime | sed 's/.*load/load/')"
  flock /work/bench.lock timeout 580 python benchmarks/bench_connector.py --dir /var/tmp/aio37bc --no-gateway \
    --sizes-mb 0.25,2 --workers 2 "$@" 2>&1 | grep -v INFO
  echo "end $(uptime | sed 's/.*load/load/')"
done
