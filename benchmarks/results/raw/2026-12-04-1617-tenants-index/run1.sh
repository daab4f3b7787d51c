#!/bin/bash
# Session 21 tenants: index cost before (main d88940e, /work/wt-tenants-red: main's sources and build) and after
# (branch tenants, /work/wt-tenants) in one run.
set -x
OUT=$1
MAIN=/work/wt-tenants-red
NEW=/work/wt-tenants
uptime
/tmp/index_hash_cost
for tree in $MAIN $NEW; do
  echo "== bench_key_index.py $tree"
  (cd $tree && python benchmarks/bench_key_index.py --counts 1000000,4000000)
done
uptime
for tree in $MAIN $NEW $NEW $MAIN; do
  echo "== bench_index.py $tree"
  rm -f /dev/shm/adp-tenants-index.img
  (cd $tree && PYTHONPATH=. ADP_LOG_LEVEL=WARNING python benchmarks/bench_index.py --card /dev/shm/adp-tenants-index.img --steps 10000,100000,1000000)
  uptime
done
rm -f /dev/shm/adp-tenants-index.img
