#!/usr/bin/env bash
# session 36 device run: where a 256 KiB store's and load's time goes on the 16-core host's local disk
# (probe_store_sync: the medium with a sync a slice, the card's I/O pattern, durable on/off), then bench_connector
# 256 KiB / 2 MiB on main (with the load read-ahead of b414dec).
R=$PWD; O=$OUT/s36; mkdir -p $O
nproc > $O/host.txt; uptime >> $O/host.txt
ADP_BUILD_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps . > $O/build.log 2>&1; echo build rc=$?; tail -2 $O/build.log
D=/var/tmp/adp36; mkdir -p $D; cd /tmp
for w in 2 4; do for k in 2 8; do
  timeout 90 python3 $R/benchmarks/probe_store_sync.py --dir $D --sizes-mb 0.25 --workers $w --keys-per-worker $k --total-mb 512 --reps 3 --out $O/probe-w$w-k$k.json > $O/probe-w$w-k$k.log 2>&1
  echo "probe w$w k$k rc=$?"; grep -E "^(==|\| (medium|embedded))" $O/probe-w$w-k$k.log
done; done
timeout ${T2:-200} python3 $R/benchmarks/bench_connector.py --dir $D --workers 2,4 --sizes-mb 0.25,2 --total-mb 1024 --reps 4 --interleave --no-gateway --out $O --label 16core-localdisk-s36 > $O/bench.log 2>&1
echo "bench rc=$?"; grep -E "^\| [0-9.]+ MiB \| [0-9]+ \| (medium|embedded)" $O/*.md | head -20
rm -rf $D
