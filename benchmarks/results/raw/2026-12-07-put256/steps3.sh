#!/bin/bash
# put256 step 3: drive.py as committed (restructured after steps2: the same calls in the same order, argparse and
# functions) traced again, durable then durable=false then durable, each under its own flock.
cd /work/wt-put256
D=benchmarks/results/raw/2026-12-07-put256
flock /work/bench.lock bash $D/probe.sh /var/tmp/put256drv 1 3 0.25 disk-durable-256k-r2
flock /work/bench.lock bash $D/probe.sh /var/tmp/put256drv 0 3 0.25 disk-nodurable-256k-r2
flock /work/bench.lock bash $D/probe.sh /var/tmp/put256drv 1 3 0.25 disk-durable-256k-r3
rm -rf /var/tmp/put256drv
