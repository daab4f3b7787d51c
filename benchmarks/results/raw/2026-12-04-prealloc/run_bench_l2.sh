#!/bin/bash
# bench_l2 on disk: a new allocated image against a new sparse one (card_sparse), fs_native O_DIRECT and the
# prefilled card, 4 passes (every other one reversed), 2 MiB and 256 KiB; uptime every 10 s beside it.
cd "$(dirname "$0")/../../../.."
R=benchmarks/results/raw/2026-12-04-prealloc
( while true; do echo "$(date -u +%T) $(uptime)"; sleep 10; done ) > $R/bench_l2_uptime.txt &
up=$!
flock /work/bench.lock env PYTHONPATH=. python benchmarks/bench_l2.py --medium disk --dir /var/tmp/prealloc-bench \
  --sizes-kb 2048,256 --passes 4 --row "ADP" --row "ADP on a new image" --row "ADP on a new sparse image" \
  --row "fs_native O_DIRECT"
rc=$?
kill $up
exit $rc
