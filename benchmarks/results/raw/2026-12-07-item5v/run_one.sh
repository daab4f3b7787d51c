#!/bin/bash
# item5v: one bench_restore run under the lock, with sample_disk.py beside it and bench's stdout time-stamped.
# usage: run_one.sh SEED TAG [REPEAT [ROUNDS]]  (run from the worktree root)
set -u
seed=$1; tag=$2; repeat=${3:-3}; rounds=${4:-2}
R=benchmarks/results/raw/2026-12-07-item5v
mkdir -p $R/$tag
flock /work/bench.lock bash -c "
  uptime > $R/$tag/uptime.txt
  python $R/sample_disk.py $R/$tag/disk.csv & S=\$!
  python $R/sample_layout.py /var/tmp/item5v $R/$tag/layout.jsonl & L=\$!
  python $R/sample_l1.py $R/$tag/l1.jsonl & M=\$!
  python -u benchmarks/bench_restore.py --workdir /var/tmp/item5v --rounds $rounds --tiers mock,adp,fs_native \
     --l1-hugetlb --server-env OMP_WAIT_POLICY=PASSIVE --seed $seed --repeat $repeat --tag $tag \
     --results-dir $R/runs 2>&1 | while IFS= read -r l; do printf '%s %s\n' \"\$(date +%s.%N)\" \"\$l\"; done > $R/$tag/bench.out
  kill \$S \$L \$M
  uptime >> $R/$tag/uptime.txt
"
