#!/bin/sh
# hugel1: one bench_restore run of item 5 on disk (real hugetlb L1s), under the bench lock, at most 590 s held.
# Usage: run_one.sh SEED [TIERS] [WORKDIR] [TAG]   (from the worktree root)
seed=$1; tiers=${2:-mock,adp,fs_native}; work=${3:-/tmp/hugel1-item5}; tag=${4:-hugel1-s$seed}
out=benchmarks/results/raw/2026-12-07-hugel1/runs
mkdir -p $out
{ date -u; uptime; } > $out/$tag.uptime
flock /work/bench.lock sh -c "{ date -u; uptime; } >> $out/$tag.uptime; timeout -s TERM 590 python benchmarks/bench_restore.py \
  --workdir $work --tiers $tiers --l1-hugetlb --server-env OMP_WAIT_POLICY=PASSIVE --seed $seed --repeat 2 \
  --rounds 1 --tag $tag --results-dir $out; echo rc=\$? >> $out/$tag.uptime; { date -u; uptime; } >> $out/$tag.uptime" \
  > $out/$tag.out 2>&1
echo "$tag: $(tail -3 $out/$tag.uptime | tr '\n' ' ')"
