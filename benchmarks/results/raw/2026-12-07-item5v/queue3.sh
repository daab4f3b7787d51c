#!/bin/bash
# item5v: queue2.sh's next seed (23: fs_native, mock, adp) puts neither order; replaced by seeds 17 (B), 21
# (fs_native, adp, mock: A), 24 (mock, adp, fs_native: B), one round each; none started at or after $STOP.
cd /work/wt-item5v
R=benchmarks/results/raw/2026-12-07-item5v
STOP=${STOP:-1944}
k=6
for seed in 17 21 24; do
  [ "$(date -u +%H%M)" -ge "$STOP" ] && break
  $R/run_one.sh $seed item5v-1r-k$k-s$seed 2 1
  k=$((k+1))
done
