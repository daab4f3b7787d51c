#!/usr/bin/env bash
# session 36 device A/B: tree copies under .s36v/<name> (git archive of a branch, results/tests/docs removed),
# each built in place; bench_connector 256 KiB on the host's local disk, 2 and 4 workers, the variants in turn,
# order reversed every other round (ABBA...). Usage: ab.sh ROUNDS NAME...
R=$PWD; O=$OUT/ab; mkdir -p $O; ROUNDS=$1; shift
nproc > $O/host.txt; uptime >> $O/host.txt
for v in "$@"; do (cd $R/.s36v/$v && ADP_BUILD_JOBS=8 python3 setup.py -q build_ext --inplace > $O/build-$v.log 2>&1; echo "build $v rc=$?") & done; wait
D=/var/tmp/adp36ab; mkdir -p $D; cd /tmp
order=("$@")
for r in $(seq 1 $ROUNDS); do
  for v in "${order[@]}"; do
    timeout 120 python3 $R/.s36v/$v/benchmarks/bench_connector.py --dir $D --workers 2,4 --sizes-mb 0.25 --total-mb 1024 --reps 3 --no-gateway --out $O/$v --label $v-r$r > $O/$v-r$r.log 2>&1
    echo "round $r $v rc=$?"; grep -E "^\| 0.25 MiB \| [0-9]+ \| embedded \| [0-9]" $O/$v/*$v-r$r.md | sed "s/^/$v r$r /"
  done
  order=($(printf '%s\n' "${order[@]}" | tac))
done
rm -rf $D
