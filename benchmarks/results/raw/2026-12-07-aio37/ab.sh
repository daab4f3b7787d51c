#!/bin/bash
# ABBA in one build (the aio37 tree): A = ADP_CARD_AIO=0 (synchronous writes: no overlap), B = AIO (the change);
# M = main (/work/main) before and after. args: dir durable reps [size_mb]
D=/work/wt-aio37/benchmarks/results/raw/2026-12-07-aio37
for order in M A B B A M; do
  case $order in
    M) cd /work/main; unset ADP_CARD_AIO;;
    A) cd /work/wt-aio37; export ADP_CARD_AIO=0;;
    B) cd /work/wt-aio37; unset ADP_CARD_AIO;;
  esac
  echo "$order $(git -C . log --oneline -1 | cut -c1-7) $(uptime | sed 's/.*load/load/')"; python $D/drive.py $1 $2 $3 $4 2>&1 | grep -v INFO
done
