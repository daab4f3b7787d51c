#!/usr/bin/env bash
# Interleaved before/after runs of benchmarks/probe_store_sync.py: OLD = main aec9a45 (git archive + its
# built _native .so, /var/tmp/gc-old), NEW = the groupcommit worktree (built in place). Each tree's
# bench_connector imports that tree's own package (built in place). Run under flock /work/bench.lock.
set -u
OUT=$1; DIR=$2; ORDER=$3; REPS=${4:-5}
mkdir -p "$OUT"
declare -A TREE=([old]=/var/tmp/gc-old [new]=/work/wt-groupcommit)
i=0
for who in $ORDER; do
  i=$((i+1))
  tag="$i-$who"
  {
    echo "### $tag: ${TREE[$who]}  $(date -u +%FT%TZ)"
    echo "uptime before: $(uptime)"
    (cd "${TREE[$who]}/benchmarks" && python /var/tmp/gc-bench/build_line.py)
  } > "$OUT/$tag.txt" 2>&1
  (cd "${TREE[$who]}" && python benchmarks/probe_store_sync.py --dir "$DIR" --sizes-mb "${SIZES:-2,32}" --workers "${WORKERS:-2}" \
     --reps "$REPS" --out "$OUT/$tag.json") 2>&1 | grep -v ' INFO: ' >> "$OUT/$tag.txt"
  echo "uptime after: $(uptime)" >> "$OUT/$tag.txt"
done
