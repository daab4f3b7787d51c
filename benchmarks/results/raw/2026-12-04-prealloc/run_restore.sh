#!/bin/bash
# bench_restore on disk: adp (image allocated at creation) against adp_sparse (card_sparse), fs_native and mock,
# 2 rounds (the second in reverse order); uptime every 10 s beside it.
cd "$(dirname "$0")/../../../.."
R=benchmarks/results/raw/2026-12-04-prealloc
( while true; do echo "$(date -u +%T) $(uptime)"; sleep 10; done ) > $R/restore_uptime.txt &
up=$!
flock /work/bench.lock env PYTHONPATH=. python benchmarks/bench_restore.py --workdir /var/tmp/prealloc-restore \
  --tiers mock,adp,adp_sparse,fs_native --rounds 2 --server-env OMP_WAIT_POLICY=PASSIVE --tag restore-disk-prealloc
rc=$?
kill $up
exit $rc
