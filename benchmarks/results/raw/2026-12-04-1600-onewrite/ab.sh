#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Embedded durable stores: old (main d88940e, /var/tmp/ow-old: git archive + main's built .so) against new (branch
# onewrite, /var/tmp/ow-new: a copy of the worktree with its own .so), alternated ROUNDS times, the order reversed
# every other round: raw/2026-12-04-0900-storesync/count_syncs.py's geometry (2 workers, batches of 2 keys a worker, 4 in flight, 1 GiB x 3 after
# a warm-up). After session 20's raw/2026-12-04-1215-diskstore/ab.sh.
# usage: ab.sh OUTFILE DIR SIZE_KB ROUNDS    (under flock /work/bench.lock)
set -u
OUT=$1; DIR=$2; KB=$3; ROUNDS=$4
HERE=$(cd "$(dirname "$0")" && pwd)
declare -A TREE=([old]=/var/tmp/ow-old [new]=/var/tmp/ow-new [oldnd]=/var/tmp/ow-old [newnd]=/var/tmp/ow-new)
declare -A DUR=([old]=1 [new]=1 [oldnd]=0 [newnd]=0)
ROWS=${ROWS:-old new}
REV=$(echo "$ROWS" | tr ' ' '\n' | tac | tr '\n' ' ')
echo "uptime before: $(uptime)" >> "$OUT"
for t in /var/tmp/ow-old /var/tmp/ow-new; do echo "tree $t .so sha256 $(sha256sum $t/lmcache_adp/_native*.so | cut -c1-16)" >> "$OUT"; done
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order=$ROWS; else order=$REV; fi
  for who in $order; do
    echo "round $r $who: $(cd "${TREE[$who]}/benchmarks" && python "$HERE/../2026-12-04-0900-storesync/count_syncs.py" "$DIR" "$KB" "${DUR[$who]}" 2>&1 | grep 'store s:')" >> "$OUT"
  done
done
echo "uptime after: $(uptime)" >> "$OUT"
