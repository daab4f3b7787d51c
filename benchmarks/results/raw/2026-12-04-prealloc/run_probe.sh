#!/bin/bash
# probe_load.py at 256 KiB (4 rounds) and 2 MiB (2 rounds), under the bench lock; uptime beside it.
cd "$(dirname "$0")/../../../.."
R=benchmarks/results/raw/2026-12-04-prealloc
( while true; do echo "$(date -u +%T) $(uptime)"; sleep 10; done ) > $R/probe_uptime.txt &
up=$!
flock /work/bench.lock sh -c "env PYTHONPATH=. ADP_LOG_LEVEL=WARNING python $R/probe_load.py 262144 4; env PYTHONPATH=. ADP_LOG_LEVEL=WARNING python $R/probe_load.py 2097152 2"
rc=$?
kill $up
exit $rc
