#!/bin/bash
# BUSY busy loops beside N runs of the given pytest selection (in the cwd); PIDs killed after.
n=$1; shift
pids=""
for i in $(seq 1 ${BUSY:-2}); do sh -c 'while :; do :; done' & pids="$pids $!"; done
echo "busy$pids"
for i in $(seq 1 $n); do
  echo "== run $i $(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 600 python -m pytest -q -p no:cacheprovider "$@" 2>&1 | grep -E "passed|failed|error|ERROR|^E |^FAILED" | cut -c1-600
done
kill $pids
echo "done $(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)"
