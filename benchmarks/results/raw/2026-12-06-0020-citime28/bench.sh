#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# bench.sh ROUND PROG ARGS... : one "before" (single process, as before this change) and one "after" (2 shards at once) run.
cd /tmp/ct28/bin
export ADP_LOG_LEVEL=ERROR
order=$1; shift
prog=$1; shift
tag=$prog-${*:-default}; tag=${tag// /_}
single() {
  local t0=$(date +%s.%N)
  ./$prog/$prog "$@" > /tmp/ct28/raw/$tag-single.log 2>&1; local rc=$?
  echo "$tag single: rc=$rc $(grep -c ': PASS' /tmp/ct28/raw/$tag-single.log) PASS, $(echo "$(date +%s.%N) - $t0" | bc) s"
}
split() {
  local t0=$(date +%s.%N)
  ./$prog/$prog "$@" shard=0/2 > /tmp/ct28/raw/$tag-shard0.log 2>&1 & local p0=$!
  ./$prog/$prog "$@" shard=1/2 > /tmp/ct28/raw/$tag-shard1.log 2>&1; local rc1=$?
  wait $p0; local rc0=$?
  echo "$tag split: rc=$rc0,$rc1 $(cat /tmp/ct28/raw/$tag-shard?.log | grep -c ': PASS') PASS, $(echo "$(date +%s.%N) - $t0" | bc) s"
}
uptime
if [ "$order" = ba ]; then single "$@"; split "$@"; else split "$@"; single "$@"; fi
uptime
