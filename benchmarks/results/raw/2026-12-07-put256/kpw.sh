#!/bin/bash
# put256: the per-batch flush's share, shown by the batch size: bench_connector on the disk at 256 KiB, 2 workers,
# --keys-per-worker 2 (LMCache's bench geometry, as every other run here) and 8 (4x the stores a batch, so about
# 4x fewer flushes a store), order 2 8 8 2, each under its own flock.
cd /work/wt-put256
for k in 2 8 8 2; do
  echo "kpw $k $(git log --oneline -1 | cut -c1-7) $(uptime | sed 's/.*load/load/')"
  flock /work/bench.lock timeout 580 python benchmarks/bench_connector.py --dir /var/tmp/put256kpw --no-gateway \
    --sizes-mb 0.25 --workers 2 --total-mb 256 --reps 3 --keys-per-worker $k --label put256-kpw$k \
    --out /work/wt-put256/benchmarks/results/raw/2026-12-07-put256/kpw 2>&1 | grep -v INFO
  echo "end $(uptime | sed 's/.*load/load/')"
  rm -rf /var/tmp/put256kpw
done
