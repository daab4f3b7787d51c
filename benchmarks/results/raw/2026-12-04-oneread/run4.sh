#!/bin/bash
# Objects of 2 MiB and 256 KiB: staged (after, 11a53b1) against straight into the buffer in one request (small:
# the same with every aligned object direct), interleaved, bench_disk_load.py; then a strace of after2.
set -u
D() { # tree kb objects
  cd /var/tmp/oneread/$1 && echo "== $(date -u +%H:%M:%S) start $1 $2 KiB x $3; $(uptime)"
  PYTHONPATH=. flock /work/bench.lock python benchmarks/bench_disk_load.py --dir /var/tmp/oneread --objects $3 \
    --object-kb $2 --workers 4 --reps 5
  echo "== $(date -u +%H:%M:%S) done $1 $2 rc=$?"
}
D after 2048 256; D small 2048 256; D after 2048 256; D small 2048 256; D after 2048 256; D small 2048 256
D small 256 1024; D after 256 1024; D small 256 1024; D after 256 1024
cd /var/tmp/oneread/after2 && PYTHONPATH=. flock /work/bench.lock strace -f --seccomp-bpf -tt -T -e trace=read,pread64,preadv,preadv2 \
  -o /var/tmp/oneread/trace-after2.txt python benchmarks/bench_restore.py --workdir /var/tmp/oneread/r-strace2 \
  --tiers fs_native,adp --rounds 1 --repeat 1 --server-env OMP_WAIT_POLICY=PASSIVE --tag restore-disk-strace-oneread-after2
echo "== $(date -u +%H:%M:%S) done strace rc=$?"
echo "== all done"
