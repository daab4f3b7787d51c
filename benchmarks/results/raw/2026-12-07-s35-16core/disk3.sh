#!/usr/bin/env bash
# session 35: 256 KiB on the 16-core host's local disk, repeated (is the gap stable?)
R=$PWD; O=$OUT/k3; mkdir -p $O
D=/var/tmp/adp35; mkdir -p $D; cd /tmp
for i in 1 2; do
timeout 200 python3 $R/benchmarks/bench_connector.py --dir $D --workers 2,4 --sizes-mb 0.25 --total-mb 1024 --reps 6 --interleave --no-gateway --out $O --label 16core-localdisk-256k-r$i > $O/bench-r$i.log 2>&1
echo "rc=$?"
done
rm -rf $D; grep -E "^\| (0.25 MiB)" $O/*.md | head -30
