#!/bin/sh
# hugel1: one perf-traced run (bench_restore --trace perf) of the card and fs_native with hugetlb L1s, under the lock.
out=benchmarks/results/raw/2026-12-07-hugel1/runs
tag=hugel1-perf-s$1
{ date -u; uptime; } > $out/$tag.uptime
flock /work/bench.lock sh -c "{ date -u; uptime; } >> $out/$tag.uptime; timeout -s TERM 590 python benchmarks/bench_restore.py \
  --workdir /tmp/hugel1-item5 --tiers adp,fs_native --l1-hugetlb --server-env OMP_WAIT_POLICY=PASSIVE --seed $1 \
  --repeat 2 --rounds 1 --trace perf --tag $tag --results-dir $out; echo rc=\$? >> $out/$tag.uptime; { date -u; uptime; } >> $out/$tag.uptime" \
  > $out/$tag.out 2>&1
echo "$tag: $(tail -3 $out/$tag.uptime | tr '\n' ' ')"
