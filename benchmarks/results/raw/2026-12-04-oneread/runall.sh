#!/bin/bash
# Interleaved before/after restore runs on disk, then strace (after), then tmpfs.
set -u
B() { # tree tag workdir
  cd /var/tmp/oneread/$1 && PYTHONPATH=. flock /work/bench.lock python benchmarks/bench_restore.py --workdir $3 \
    --tiers fs_native,adp,mock --rounds 1 --repeat 3 --server-env OMP_WAIT_POLICY=PASSIVE --tag $2
  echo "== $(date -u +%H:%M:%S) done $1 $2 rc=$?"
}
B after restore-disk-oneread-after-r1 /var/tmp/oneread/r-after
B before restore-disk-oneread-before-r2 /var/tmp/oneread/r-before
B after restore-disk-oneread-after-r2 /var/tmp/oneread/r-after
B before restore-disk-oneread-before-r3 /var/tmp/oneread/r-before
B after restore-disk-oneread-after-r3 /var/tmp/oneread/r-after
cd /var/tmp/oneread/after && PYTHONPATH=. flock /work/bench.lock strace -f --seccomp-bpf -tt -T -e trace=read,pread64,preadv,preadv2 \
  -o /var/tmp/oneread/trace-after.txt python benchmarks/bench_restore.py --workdir /var/tmp/oneread/r-strace \
  --tiers fs_native,adp --rounds 1 --repeat 1 --server-env OMP_WAIT_POLICY=PASSIVE --tag restore-disk-strace-oneread-after
echo "== $(date -u +%H:%M:%S) done strace rc=$?"
B after restore-tmpfs-oneread-after /dev/shm/oneread-after
rm -rf /dev/shm/oneread-after
B before restore-tmpfs-oneread-before /dev/shm/oneread-before
rm -rf /dev/shm/oneread-before
echo "== all done"
