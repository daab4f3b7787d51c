#!/bin/sh
# Task 2/3 of disk29: bench_l2's store geometry (lmcache bench l2, 4 batches of 32 keys in flight, QD4, hugetlb L1,
# --only store, 1 warmup + ROUNDS rounds) under strace, per row; and count_syncs.py (probe_store_sync's "embedded
# durable" geometry: 2 workers, batches of 4 keys, 4 in flight, 1 GiB x 3 + warm-up) beside it.
# usage: store_strace.sh OUTDIR SIZE_KB ROUNDS ROWS...   rows: D N F S1 S2 P1 P2 (see below)
set -u
OUT=$1; KB=$2; ROUNDS=$3; shift 3
TREE=/work/wt-disk29
W=/var/tmp/disk29-st/$KB
mkdir -p "$OUT" "$W"
export PYTHONPATH=$TREE LMCACHE_DISABLE_BANNER=1
HP=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
HP0=$(cat $HP)
echo $((HP0 + 257)) > $HP
trap 'echo $HP0 > $HP; rm -rf $W' EXIT
uptime
dd if=/dev/zero of=$W/card.img bs=64M count=64 oflag=direct conv=fsync status=none
echo "card.img prefilled: $(filefrag $W/card.img)"
trace="fdatasync,fsync,pwritev,pwritev2,pwrite64,write,fallocate,openat"
bench() {  # name spec
  name=$1; spec=$2
  rm -rf $W/files; sync
  /usr/bin/time -f "$name: %e s wall, %U user %S sys" strace -f -T -tt -e trace=$trace -o $OUT/strace-$KB-$name.txt \
    lmcache bench l2 --l2-adapter "$spec" --num-keys 32 --in-flight 4 --data-size-kb $KB --l1-align-bytes 4096 \
    --rounds $ROUNDS --warmup-rounds 1 --only store --l1-use-hugepages --format json --output $OUT/bench-$KB-$name.json -q \
    > $OUT/bench-$KB-$name.log 2>&1
  tail -1 $OUT/bench-$KB-$name.log
  python3 -c "import json,sys; m=json.load(open('$OUT/bench-$KB-$name.json'))['metrics']; s=[v for k,v in m.items() if k.startswith('op_')][0]; print('$name store MiB/s (median round):', round(32*4*$KB/1024/s['duration_p50_ms']*1000), 'ok', s['total_success'], '/', s['total_keys'])"
}
fmt() { python3 -c "import lmcache_adp; lmcache_adp.format_card('$1')" || exit 1; sync; }
adp() { echo "{\"type\":\"native_plugin\",\"module_path\":\"lmcache_adp\",\"class_name\":\"ADPConnector\",\"adapter_params\":{\"num_workers\":4,\"card\":\"$W/$1\",\"card_size_gb\":4${2:-}}}"; }
for row in "$@"; do
  case $row in
    D) fmt $W/card.img; bench D "$(adp card.img)";;                       # prefilled image, durable (bench_l2's ADP)
    N) fmt $W/card.img; bench N "$(adp card.img ',"durable":false')";;    # prefilled image, durable=false
    F) bench F "{\"type\":\"fs_native\",\"base_path\":\"$W/files\",\"num_workers\":4,\"use_odirect\":true}";;
    S1) rm -f $W/sparse.img; bench S1 "$(adp sparse.img)"; echo "sparse.img after S1: $(filefrag $W/sparse.img)";;  # new sparse image: first fill
    S2) fmt $W/sparse.img; bench S2 "$(adp sparse.img)";;                 # the same image, second pass (written once)
    P1) rm -f $W/pre.img; bench P1 "$(adp pre.img ',"card_preallocate":true')";;
    C1) (cd $TREE/benchmarks && strace -f -T -tt -e trace=fdatasync,pwritev,pwritev2 -o $OUT/strace-$KB-C1.txt python3 $TREE/benchmarks/results/raw/2026-12-04-0900-storesync/count_syncs.py $W/cs $KB 1 2>&1 | tail -2);;
    C0) (cd $TREE/benchmarks && strace -f -T -tt -e trace=fdatasync,pwritev,pwritev2 -o $OUT/strace-$KB-C0.txt python3 $TREE/benchmarks/results/raw/2026-12-04-0900-storesync/count_syncs.py $W/cs $KB 0 2>&1 | tail -2);;
  esac
  uptime
done
rm -f $W/sparse.img $W/pre.img
