#!/bin/bash
# item5v: the probe, then bench_restore runs (each under the lock on its own), none started after $STOP (UTC HHMM).
cd /work/wt-item5v
R=benchmarks/results/raw/2026-12-07-item5v
STOP=${STOP:-1950}
flock /work/bench.lock bash -c "uptime > $R/probe-uptime.txt; python $R/probe.py /var/tmp/item5v-probe $R/probe.json 2 > $R/probe.out 2>&1; uptime >> $R/probe-uptime.txt"
k=2
for seed in 1 4 9 17 2 8 11 24; do
  [ "$(date -u +%H%M)" -ge "$STOP" ] && break
  $R/run_one.sh $seed item5v-r$k-s$seed 2
  k=$((k+1))
done
