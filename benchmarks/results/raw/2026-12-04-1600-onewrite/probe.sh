#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# probe_store_sync.py (medium rows beside the embedded store rows) of each tree in ORDER, SIZES MiB, 2 workers.
# The medium rows are the same code in both trees (the new tree's probe: both run /var/tmp/ow-new's script, with
# each tree's package). usage: probe.sh "old new new old" REPS SIZES TAG   (under flock /work/bench.lock)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
declare -A TREE=([old]=/var/tmp/ow-old [new]=/var/tmp/ow-new)
i=0
for who in $1; do
  i=$((i + 1))
  out=$HERE/probe/$4-$i-$who
  { echo "uptime before: $(uptime)"; echo "tree ${TREE[$who]} .so sha256 $(sha256sum ${TREE[$who]}/lmcache_adp/_native*.so | cut -c1-16)"
    cp /var/tmp/ow-new/benchmarks/probe_store_sync.py "${TREE[$who]}/benchmarks/probe_store_sync_ow.py"
    python "${TREE[$who]}/benchmarks/probe_store_sync_ow.py" --dir /var/tmp/ow-probe --sizes-mb "$3" --workers 2 --reps "$2" --out "$out.json"
    echo "uptime after: $(uptime)"; } > "$out.txt" 2>&1
done
