#!/bin/sh
# hugel1: more rounds after queue.sh, alternating A (seeds 31 39 41 43 45 46) and B (30 32 34 35 38 48); none started after
# 23:20 UTC (the results' deadline is 23:40). Stops at /tmp/hugel1-STOP.
for s in 31 30 39 32 41 34 43 35 45 38 46 48; do
  [ -e /tmp/hugel1-STOP ] && break
  [ "$(date -u +%H%M)" -ge 2320 ] && break
  benchmarks/results/raw/2026-12-07-hugel1/run_one.sh $s
done
