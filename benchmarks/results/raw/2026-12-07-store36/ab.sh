#!/bin/bash
# ABBA: A = main, B = store36; args: dir durable reps
for order in A B B A; do
  if [ $order = A ]; then cd /tmp/s36/maintree; else cd /work/wt-store36; fi
  echo "$order $(uptime | sed 's/.*load/load/')"; python /tmp/s36/drive.py $1 $2 $3 2>&1 | grep -v INFO
done
