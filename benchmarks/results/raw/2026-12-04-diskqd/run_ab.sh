#!/bin/bash
# ABAB: bench_restore from the base copy (= main d88940e) and the nocrc experiment copy, order alternated.
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="base nocrc"; else order="nocrc base"; fi
  for t in $order; do
    cd /var/tmp/diskqd/trees/$t
    echo "== round $r tree $t start $(date -u +%H:%M:%S) $(uptime)"
    flock /work/bench.lock env PYTHONPATH=. python benchmarks/bench_restore.py --workdir /var/tmp/diskqd/r \
      --tiers fs_native,adp,mock --rounds 1 --repeat 3 --server-env OMP_WAIT_POLICY=PASSIVE \
      --tag restore-disk-diskqd-$t-r$r 2>&1 | grep -v "^\s*$" | tail -4
    echo "== round $r tree $t end $(date -u +%H:%M:%S) $(uptime)"
  done
done
