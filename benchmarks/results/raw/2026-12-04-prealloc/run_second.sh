#!/bin/bash
# Second invocation: the medium alone (fio_fill_read.sh), then bench_l2 with the new and the new sparse image
# and fs_native only, 6 passes, 256 KiB and 2 MiB; uptime every 10 s beside it. One flock for both.
cd "$(dirname "$0")/../../../.."
R=benchmarks/results/raw/2026-12-04-prealloc
( while true; do echo "$(date -u +%T) $(uptime)"; sleep 10; done ) > $R/second_uptime.txt &
up=$!
flock /work/bench.lock sh -c "$R/fio_fill_read.sh > $R/fio_fill_read.txt 2>&1; env PYTHONPATH=. python benchmarks/bench_l2.py --medium disk --dir /var/tmp/prealloc-bench \
  --sizes-kb 256,2048 --passes 6 --row 'ADP on a new image' --row 'ADP on a new sparse image' --row 'fs_native O_DIRECT'"
rc=$?
kill $up
exit $rc
