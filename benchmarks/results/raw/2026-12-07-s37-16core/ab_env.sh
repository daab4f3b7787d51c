#!/usr/bin/env bash
# session 37 device A/B in one build: tree .s37v/<tree>, variants = values of an environment variable
# (ADP_CARD_AIO=0 / 1 for aio37), in turn, order reversed every round. Usage: VAR=ADP_CARD_AIO ab_env.sh TREE ROUNDS VALUE...
R=$PWD; O=$OUT/ab; mkdir -p $O; TREE=$1; ROUNDS=$2; shift 2
nproc > $O/host.txt; uptime >> $O/host.txt
(cd $R/.s37v/$TREE && ADP_BUILD_JOBS=16 python3 setup.py -q build_ext --inplace > $O/build.log 2>&1; echo "build rc=$?")
D=/var/tmp/adp37ab; mkdir -p $D; cd /tmp
order=("$@")
for r in $(seq 1 $ROUNDS); do
  for v in "${order[@]}"; do
    s=$(date +%s)
    env $VAR=$v timeout ${T:-240} python3 $R/.s37v/$TREE/benchmarks/bench_connector.py --dir $D --workers ${WORKERS:-2,4} --sizes-mb ${SIZES:-0.25} --total-mb 1024 --reps ${REPS:-3} --no-gateway --out $O/$v --label $VAR$v-r$r > $O/$v-r$r.log 2>&1
    echo "round $r $VAR=$v rc=$? $(( $(date +%s) - s )) s load $(cut -d' ' -f1 /proc/loadavg)"; grep -E "^\| [0-9.]+ MiB \| [0-9]+ \| (medium|embedded) \| [0-9]" $O/$v/*-r$r.md | sed "s/^/$v r$r /"; grep -E "^\| [0-9.]+ MiB \| [0-9]+ \| embedded \| store \|" $O/$v/*-r$r.md | sed "s/^/$v r$r split /"
  done
  order=($(printf '%s\n' "${order[@]}" | tac))
done
rm -rf $D
