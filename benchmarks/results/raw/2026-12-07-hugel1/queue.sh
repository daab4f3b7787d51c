#!/bin/sh
# hugel1: the item-5 disk runs, orders alternating A (card right after fs_native) and B (fs_native right after the
# card): seeds A 4 9 8 21 11 13 12 16, B 5 1 17 24 14 2 3 15 (tools.round_orders, one round). Stops at STOP file.
for s in 4 5 9 1 8 17 21 24 11 14 13 2 12 3 16 15; do
  [ -e /tmp/hugel1-STOP ] && break
  benchmarks/results/raw/2026-12-07-hugel1/run_one.sh $s
done
