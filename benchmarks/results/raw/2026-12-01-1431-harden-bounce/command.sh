#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Before/after of the bounce copy (review r5 item 2), one run on this VM: both trees built in place
# (before = main 1527899, after = 6786c20), alternated, same arguments. The process row runs on its
# own (with pieces,process in one invocation the process row reported 0 process loads in both trees).
set -x
cd /tmp
uptime
for round in 1 2 3; do
  for t in before after; do
    for rows in process pieces; do
      rm -rf /dev/shm/hbench-$t; mkdir -p /dev/shm/hbench-$t
      python /tmp/harden-$t/benchmarks/bench_connector.py --dir /dev/shm/hbench-$t --workers 2 --sizes-mb 2,32 \
        --total-mb 512 --reps 5 --gateway-rows $rows --out /tmp/harden-bench-out/$t-$rows-$round --label $t-$rows-$round
      rm -rf /dev/shm/hbench-$t
    done
  done
done
uptime
