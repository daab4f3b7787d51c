#!/usr/bin/env bash
# session 35: A/B on this VM's disk after CI: A = /work/main (load read-ahead, per-run sync), B = /work/wt-dab
# (deferred store sync, no load read-ahead); ABBA, each step one bench_connector run, under the bench lock.
O=/work/main/benchmarks/results/raw/2026-12-07-s35-vm-ab; mkdir -p $O
cd /tmp
for step in A1 B1 B2 A2; do
  case $step in A*) T=/work/main;; B*) T=/work/wt-dab;; esac
  uptime > $O/uptime-$step.txt
  flock /work/bench.lock timeout 300 python $T/benchmarks/bench_connector.py --dir /var/tmp/ab35 --workers 2,4 --sizes-mb 0.25,2 --total-mb 512 --reps 4 --no-gateway --out $O --label vm-ab-$step > $O/bench-$step.log 2>&1
  echo "$step rc=$? $(grep -m1 package: $O/bench-$step.log)"
  uptime >> $O/uptime-$step.txt
done
rm -rf /var/tmp/ab35
cd $O && for f in *vm-ab-*.md; do echo "== $f"; grep -E "^\| (0.25|2) MiB \| [24] \| (medium|embedded) \|" $f; done
