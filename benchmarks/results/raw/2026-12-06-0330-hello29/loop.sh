#!/bin/bash
# 2 busy loops beside N runs of the given pytest selection; PIDs killed after.
cd /work/wt-hello29
n=$1; shift
sh -c 'while :; do :; done' & b1=$!
sh -c 'while :; do :; done' & b2=$!
echo "busy $b1 $b2"
for i in $(seq 1 $n); do
  echo "== run $i $(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 600 python -m pytest -q -s -p no:cacheprovider "$@" 2>&1 | grep -E "status query|passed|failed|error|ERROR|^E " | cut -c1-400
done
kill $b1 $b2
echo "done $(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)"
