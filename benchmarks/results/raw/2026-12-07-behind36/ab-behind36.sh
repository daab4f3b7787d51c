#!/usr/bin/env bash
# session 36 (brief behind36): ABBA on this VM's disk (/var/tmp). A = main 0702dc5 (git archive in /tmp/b36A, main's
# built _native copied in), B = branch behind36 (/work/wt-behind36: a worker's next store written while its last
# one's sync runs). Each step: probe_store_sync (0.25 MiB, 2 then 4 workers, 2 keys a worker) and one bench_connector
# run, each command under the bench lock.
O=${O:-/work/wt-behind36/benchmarks/results/raw/2026-12-07-behind36}; mkdir -p $O
cd /tmp
for step in ${STEPS:-A1 B1 B2 A2}; do
  case $step in A*) T=/tmp/b36A;; B*) T=/work/wt-behind36;; esac
  uptime > $O/uptime-$step.txt
  for w in 2 4; do
    flock /work/bench.lock timeout 400 python $T/benchmarks/probe_store_sync.py --dir /var/tmp/b36probe --sizes-mb 0.25 \
      --workers $w --keys-per-worker 2 --total-mb 256 --reps 1 --out $O/probe-$step-w$w.json > $O/probe-$step-w$w.log 2>&1
    echo "$step probe w$w rc=$?"
    rm -rf /var/tmp/b36probe
  done
  flock /work/bench.lock timeout 500 python $T/benchmarks/bench_connector.py --dir /var/tmp/b36ab --workers 2,4 \
    --sizes-mb 0.25,2 --total-mb 512 --reps 4 --no-gateway --out $O --label b36-ab-$step > $O/bench-$step.log 2>&1
  echo "$step bench rc=$? $(grep -m1 package: $O/bench-$step.log)"
  rm -rf /var/tmp/b36ab
  uptime >> $O/uptime-$step.txt
done
