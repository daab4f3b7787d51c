#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Embedded stores only, old (main 0a2ddb2, /var/tmp/ss-old) against new (/var/tmp/ss-new), durable, and the new
# tree's durable=false (the limit without syncs), alternated ROUNDS times (order reversed every other round):
# count_syncs.py's geometry (2 workers, batches of 2 keys a worker, 4 in flight, 1 GiB x 3 after a warm-up).
# usage: ab.sh OUTFILE DIR SIZE_KB ROUNDS    (under flock /work/bench.lock)
set -u
OUT=$1; DIR=$2; KB=$3; ROUNDS=$4
HERE=$(cd "$(dirname "$0")" && pwd)
# new2: the final share rule (the queue over all the workers), /var/tmp/ss-new2; ROWS picks the rows (first runs:
# "old new nd" with nd on /var/tmp/ss-new; ND_TREE sets nd's tree).
declare -A TREE=([old]=/var/tmp/ss-old [new]=/var/tmp/ss-new [new2]=/var/tmp/ss-new2 [nd]=${ND_TREE:-/var/tmp/ss-new})
declare -A DUR=([old]=1 [new]=1 [new2]=1 [nd]=0)
ROWS=${ROWS:-old new nd}
REV=$(echo "$ROWS" | tr ' ' '\n' | tac | tr '\n' ' ')
echo "uptime before: $(uptime)" >> "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order=$ROWS; else order=$REV; fi
  for who in $order; do
    echo "round $r $who: $(cd "${TREE[$who]}/benchmarks" && python "$HERE/count_syncs.py" "$DIR" "$KB" "${DUR[$who]}" 2>&1 | grep 'store s:')" >> "$OUT"
  done
done
echo "uptime after: $(uptime)" >> "$OUT"
