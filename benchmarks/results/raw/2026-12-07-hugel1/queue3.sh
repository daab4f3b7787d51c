#!/bin/sh
# hugel1: still more rounds after queue2.sh while time allows, alternating A and B (seeds from tools.round_orders:
# 49 51 50 55 54 59 57 67 60 68 63 72 65 78 66 81); none started after 23:12 UTC. Stops at /tmp/hugel1-STOP.
for s in 49 51 50 55 54 59 57 67 60 68 63 72 65 78 66 81; do
  [ -e /tmp/hugel1-STOP ] && break
  [ "$(date -u +%H%M)" -ge 2312 ] && break
  benchmarks/results/raw/2026-12-07-hugel1/run_one.sh $s
done
