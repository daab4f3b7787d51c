#!/bin/bash
# bench_connector rounds, disk (/var/tmp) and tmpfs (/dev/shm), 256 KiB and 2 MiB, 2 workers, stores + loads; each run
# under its own flock. $1 = rounds; output to stdout.
cd /work/wt-put256
for r in $(seq 1 ${1:-2}); do
  for dir in /var/tmp/put256bc /dev/shm/put256bc; do
    echo "round $r $dir $(git log --oneline -1 | cut -c1-7) $(uptime | sed 's/.*load/load/')"
    flock /work/bench.lock timeout 580 python benchmarks/bench_connector.py --dir $dir --no-gateway \
      --sizes-mb 0.25,2 --workers 2 --total-mb 256 --reps 3 --label put256-$(basename $(dirname $dir)) \
      --out /work/wt-put256/benchmarks/results/raw/2026-12-07-put256/bc 2>&1 | grep -v INFO
    echo "end $(uptime | sed 's/.*load/load/')"
    rm -rf $dir
  done
done
