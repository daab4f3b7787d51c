#!/bin/bash
# put256 step 2: probe_store_sync on the disk (the medium's variants: sync per slice, header block, CRC) and the
# traced / sampled stores (probe.sh); each command under its own flock.
cd /work/wt-put256
D=benchmarks/results/raw/2026-12-07-put256
echo "== probe_store_sync disk $(uptime | sed 's/.*load/load/')"
flock /work/bench.lock timeout 580 python benchmarks/probe_store_sync.py --dir /var/tmp/put256probe --sizes-mb 0.25,2 \
  --workers 2 --total-mb 256 --reps 3 --out $D/probe-disk.json 2>&1 | grep -v INFO
rm -rf /var/tmp/put256probe
echo "== end $(uptime | sed 's/.*load/load/')"
flock /work/bench.lock bash $D/probe.sh /var/tmp/put256drv 1 3 0.25 disk-durable-256k
flock /work/bench.lock bash $D/probe.sh /var/tmp/put256drv 0 3 0.25 disk-nodurable-256k
flock /work/bench.lock bash $D/probe.sh /var/tmp/put256drv 1 3 2 disk-durable-2m
flock /work/bench.lock bash $D/probe.sh /dev/shm/put256drv 1 3 0.25 shm-durable-256k
MODE=record flock /work/bench.lock bash $D/probe.sh /var/tmp/put256drv 1 3 0.25 rec-disk-durable-256k
rm -rf /var/tmp/put256drv /dev/shm/put256drv
