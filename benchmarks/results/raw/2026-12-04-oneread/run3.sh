#!/bin/bash
# before (0a2ddb2) against after2 (5f2220d), interleaved: connector level 32 MiB, then MP server restores.
set -u
D() {
  cd /var/tmp/oneread/$1 && echo "== $(date -u +%H:%M:%S) start $1 32 MiB x 32; $(uptime)"
  PYTHONPATH=. flock /work/bench.lock python benchmarks/bench_disk_load.py --dir /var/tmp/oneread --objects 32 \
    --object-mb 32 --workers 4 --reps 5
  echo "== $(date -u +%H:%M:%S) done $1 rc=$?"
}
B() { # tree tag workdir
  cd /var/tmp/oneread/$1 && PYTHONPATH=. flock /work/bench.lock python benchmarks/bench_restore.py --workdir $3 \
    --tiers fs_native,adp,mock --rounds 1 --repeat 3 --server-env OMP_WAIT_POLICY=PASSIVE --tag $2
  echo "== $(date -u +%H:%M:%S) done $1 $2 rc=$?"
}
D after2; D before; D after2; D before; D after2
B after2 restore-disk-oneread-after2-r1 /var/tmp/oneread/r-after2
B before restore-disk-oneread-before-r4 /var/tmp/oneread/r-before
B after2 restore-disk-oneread-after2-r2 /var/tmp/oneread/r-after2
B before restore-disk-oneread-before-r5 /var/tmp/oneread/r-before
B after2 restore-disk-oneread-after2-r3 /var/tmp/oneread/r-after2
echo "== all done"
