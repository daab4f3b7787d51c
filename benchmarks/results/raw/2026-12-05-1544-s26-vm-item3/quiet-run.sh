#!/bin/bash
# Session 26 quiet-machine disk measurements for issue 10 items 3, 4, 5
cd /work/main
exec > /tmp/s26q/console.log 2>&1
set -x
uptime; date -u
git rev-parse HEAD
python benchmarks/bench_connector.py --dir /var/tmp/s26-conn --workers 2 --sizes-mb 2,32 --total-mb 1024 --reps 5 --no-gateway --out /tmp/s26q/item3 --label vm-disk-item3-s26-quiet
uptime; date -u
python benchmarks/bench_l2.py --medium disk --dir /var/tmp/s26-l2 --sizes-kb 256,2048 --passes 6
uptime; date -u
python benchmarks/bench_restore.py --workdir /var/tmp/s26-restore --rounds 2 --server-env OMP_WAIT_POLICY=PASSIVE --tag restore-disk-s26-quiet
uptime; date -u
rm -rf /var/tmp/s26-conn /var/tmp/s26-l2 /var/tmp/s26-restore
echo DONE
