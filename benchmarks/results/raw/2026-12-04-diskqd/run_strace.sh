#!/bin/bash
cd /work/wt-diskqd
uptime
strace -f --seccomp-bpf -tt -T -e trace=read,pread64,preadv,preadv2,openat -o /var/tmp/diskqd/trace.txt \
  env PYTHONPATH=. python benchmarks/bench_restore.py --workdir /var/tmp/diskqd/r-strace --tiers fs_native,adp,mock \
  --rounds 1 --repeat 3 --server-env OMP_WAIT_POLICY=PASSIVE --tag restore-disk-diskqd-strace
echo rc=$?
uptime
