#!/usr/bin/env bash
# session 36 (brief sync36): ABBA on this VM's disk (/var/tmp). A = main dad3617 + the worker_put_runs counter only
# (/work/wt-sync36a, branch sync36-a-stat: main's schedule, counted), B = sync36 (/work/wt-sync36: the deferred store
# sync). Each step: probe_store_sync (0.25 and 2 MiB, 2 then 4 workers) and one bench_connector run, each command
# under the bench lock.
O=${O:-/work/wt-sync36/benchmarks/results/raw/2026-12-07-sync36}; mkdir -p $O
cd /tmp
for step in ${STEPS:-A1 B1 B2 A2}; do
  case $step in A*) T=/work/wt-sync36a;; B*) T=/work/wt-sync36;; esac
  uptime > $O/uptime-$step.txt
  for w in 2 4; do
    flock /work/bench.lock timeout 400 python $T/benchmarks/probe_store_sync.py --dir /var/tmp/s36probe --sizes-mb 0.25,2 \
      --workers $w --keys-per-worker 2 --total-mb 256 --reps 1 --out $O/probe-$step-w$w.json > $O/probe-$step-w$w.log 2>&1
    echo "$step probe w$w rc=$?"
    rm -rf /var/tmp/s36probe
  done
  flock /work/bench.lock timeout 400 python $T/benchmarks/bench_connector.py --dir /var/tmp/s36ab --workers 2,4 \
    --sizes-mb 0.25,2 --total-mb 512 --reps 4 --no-gateway --out $O --label s36-ab-$step > $O/bench-$step.log 2>&1
  echo "$step bench rc=$? $(grep -m1 package: $O/bench-$step.log)"
  rm -rf /var/tmp/s36ab
  uptime >> $O/uptime-$step.txt
done
