#!/bin/bash
# After runall: connector level before/after at 32 MiB (bench_disk_load.py), then objects of 2 MiB staged against direct.
set -u
while ! grep -q "== all done" /var/tmp/oneread/runall.log; do sleep 5; done
D() { # tree kb objects
  cd /var/tmp/oneread/$1 && echo "== $(date -u +%H:%M:%S) start $1 $2 KiB x $3; $(uptime)"
  PYTHONPATH=. flock /work/bench.lock python benchmarks/bench_disk_load.py --dir /var/tmp/oneread --objects $3 \
    --object-kb $2 --workers 4 --reps 5
  echo "== $(date -u +%H:%M:%S) done $1 $2 rc=$?"
}
D before 32768 32; D after 32768 32; D before 32768 32; D after 32768 32
D after 2048 256; D small 2048 256; D small 2048 256; D after 2048 256
echo "== all done"
