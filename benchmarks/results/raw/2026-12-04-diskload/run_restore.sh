#!/bin/bash
# bench_restore on disk: default card geometry (adp) against regions of two chunks (adp_fit), fs_native and mock, same run
cd /work/wt-diskload
echo "start $(date -u +%FT%TZ) uptime: $(uptime)"
flock /work/bench.lock env PYTHONPATH=. python benchmarks/bench_restore.py --workdir /var/tmp/diskload/r \
  --tiers fs_native,adp,adp_fit,mock --rounds ${ROUNDS:-2} --repeat 3 --server-env OMP_WAIT_POLICY=PASSIVE \
  --tag restore-disk-diskload-fit-${RUN:-r1}
echo "end $(date -u +%FT%TZ) uptime: $(uptime)"
