#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Embedded stores only: old (main 92de455, /var/tmp/ds-old: git archive + main's built .so) against new (the branch,
# /var/tmp/ds-new: a copy of the worktree with its own .so), durable, and each tree's durable=false (the limit
# without syncs), alternated ROUNDS times, the order reversed every other round: count_syncs.py's geometry
# (2 workers, batches of 2 keys a worker, 4 in flight, 1 GiB x 3 after a warm-up).
# usage: ab.sh OUTFILE DIR SIZE_KB ROUNDS    (under flock /work/bench.lock)
set -u
OUT=$1; DIR=$2; KB=$3; ROUNDS=$4
HERE=$(cd "$(dirname "$0")" && pwd)
declare -A TREE=([old]=/var/tmp/ds-old [new]=/var/tmp/ds-new [oldnd]=/var/tmp/ds-old [newnd]=/var/tmp/ds-new)
declare -A DUR=([old]=1 [new]=1 [oldnd]=0 [newnd]=0)
ROWS=${ROWS:-old new oldnd newnd}
REV=$(echo "$ROWS" | tr ' ' '\n' | tac | tr '\n' ' ')
echo "uptime before: $(uptime)" >> "$OUT"
for t in /var/tmp/ds-old /var/tmp/ds-new; do echo "tree $t .so sha256 $(sha256sum $t/lmcache_adp/_native*.so | cut -c1-16)" >> "$OUT"; done
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order=$ROWS; else order=$REV; fi
  for who in $order; do
    echo "round $r $who: $(cd "${TREE[$who]}/benchmarks" && python "$HERE/../2026-12-04-0900-storesync/count_syncs.py" "$DIR" "$KB" "${DUR[$who]}" 2>&1 | grep 'store s:')" >> "$OUT"
  done
done
echo "uptime after: $(uptime)" >> "$OUT"
