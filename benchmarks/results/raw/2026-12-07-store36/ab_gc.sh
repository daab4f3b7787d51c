#!/bin/bash
# main's package; A = GC on, B = gc.disable() over the timed stores (the harness's GC), ABBA; args: dir durable reps
cd /tmp/s36/maintree
for order in A B B A; do
  echo "$order $(uptime | sed 's/.*load/load/')"
  if [ $order = B ]; then NOGC=1 python /tmp/s36/drive.py $1 $2 $3 2>&1 | grep GB; else python /tmp/s36/drive.py $1 $2 $3 2>&1 | grep GB; fi
done
