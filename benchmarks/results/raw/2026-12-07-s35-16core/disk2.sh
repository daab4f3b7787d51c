#!/usr/bin/env bash
# session 35: item 3 (and 1) on the 16-core host's local disk (ext4 on virtio), 256 KiB and 2 MiB, interleaved
R=$PWD; O=$OUT/k; mkdir -p $O
python3 -c "import lmcache_adp" 2>/dev/null || ADP_BUILD_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps . > $O/build.log 2>&1
D=/var/tmp/adp35; mkdir -p $D; cd /tmp
timeout 400 python3 $R/benchmarks/bench_connector.py --dir $D --workers 2,4,16 --sizes-mb 0.25,2 --total-mb 1024 --reps 5 --interleave --no-gateway --out $O --label 16core-localdisk-256k > $O/bench-disk2.log 2>&1
echo "rc=$?"; rm -rf $D; grep -E "^\| (256 KiB|2 MiB)" $O/*.md | head -20
