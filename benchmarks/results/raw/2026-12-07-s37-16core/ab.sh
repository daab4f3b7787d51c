#!/usr/bin/env bash
# session 37 device runs: tree copies under .s37v/<name> (git archive of a commit, results/tests/docs removed),
# each built in place; bench_connector on the host's local disk, the variants in turn, order reversed every round.
# Usage: SIZES=0.25,2 WORKERS=2,4,8 REPS=3 ab.sh ROUNDS NAME...
R=$PWD; O=$OUT/ab; mkdir -p $O; ROUNDS=$1; shift
nproc > $O/host.txt; uptime >> $O/host.txt
for v in "$@"; do (cd $R/.s37v/$v && ADP_BUILD_JOBS=8 python3 setup.py -q build_ext --inplace > $O/build-$v.log 2>&1; echo "build $v rc=$?") & done; wait
D=/var/tmp/adp37ab; mkdir -p $D; cd /tmp
order=("$@")
for r in $(seq 1 $ROUNDS); do
  for v in "${order[@]}"; do
    s=$(date +%s)
    timeout ${T:-240} python3 $R/.s37v/$v/benchmarks/bench_connector.py --dir $D --workers ${WORKERS:-2,4} --sizes-mb ${SIZES:-0.25} --total-mb 1024 --reps ${REPS:-3} --no-gateway --out $O/$v --label $v-r$r > $O/$v-r$r.log 2>&1
    echo "round $r $v rc=$? $(( $(date +%s) - s )) s load $(cut -d' ' -f1 /proc/loadavg)"; grep -E "^\| [0-9.]+ MiB \| [0-9]+ \| (medium|embedded)" $O/$v/*$v-r$r.md | sed "s/^/$v r$r /"
  done
  order=($(printf '%s\n' "${order[@]}" | tac))
done
rm -rf $D
