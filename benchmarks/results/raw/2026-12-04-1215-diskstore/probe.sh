#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# probe_store_sync.py (medium rows beside the embedded store rows) of each tree in ORDER, 2 MiB, 2 workers.
# usage: probe.sh "old new new old" REPS    (under flock /work/bench.lock)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
declare -A TREE=([old]=/var/tmp/ds-old [new]=/var/tmp/ds-new)
i=0
for who in $1; do
  i=$((i + 1))
  out=$HERE/probe/$i-$who
  { echo "uptime before: $(uptime)"; echo "tree ${TREE[$who]} .so sha256 $(sha256sum ${TREE[$who]}/lmcache_adp/_native*.so | cut -c1-16)"
    python "${TREE[$who]}/benchmarks/probe_store_sync.py" --dir /var/tmp/ds-probe2 --sizes-mb 2 --workers 2 --reps "$2" --out "$out.json"
    echo "uptime after: $(uptime)"; } > "$out.txt" 2>&1
done
