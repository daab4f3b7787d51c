#!/bin/bash
# item5v: under the lead's test run a 2-round run took over 10 min under the lock; from here one round a run,
# the round-1 orders alternating A (the card right after fs_native) and B (fs_native right after the card):
# seed 4 fs_native,adp,mock (A); 5 mock,adp,fs_native (B); 9 mock,fs_native,adp (A); 1 adp,fs_native,mock (B); ...
# none started at or after $STOP (UTC HHMM).
cd /work/wt-item5v
R=benchmarks/results/raw/2026-12-07-item5v
STOP=${STOP:-1943}
k=1
for seed in 4 5 9 1 8 17 23 2; do
  [ "$(date -u +%H%M)" -ge "$STOP" ] && break
  $R/run_one.sh $seed item5v-1r-k$k-s$seed 2 1
  k=$((k+1))
done
