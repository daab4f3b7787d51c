#!/bin/bash
# strace -f -c of `lmcache bench l2` (as bench_l2.py runs it, 8 rounds of 128 keys at 256 KiB after 1 warm-up)
# for ADP (num_workers 4) and fs_native O_DIRECT (num_workers 4) on /var/tmp; syscall counts per key.
set -u
OUT=$1; W=/var/tmp/disk-strace; mkdir -p $OUT $W
export PYTHONPATH=/work/wt-disk LMCACHE_DISABLE_BANNER=1
dd if=/dev/zero of=$W/card.img bs=64M count=16 oflag=direct conv=fsync status=none
for row in adp fsnative; do
  rm -rf $W/files; python -c "import lmcache_adp; lmcache_adp.format_card('$W/card.img')"; sync
  if [ $row = adp ]; then spec="{\"type\":\"native_plugin\",\"module_path\":\"lmcache_adp\",\"class_name\":\"ADPConnector\",\"adapter_params\":{\"num_workers\":4,\"card\":\"$W/card.img\",\"card_size_gb\":1}}"
  else spec="{\"type\":\"fs_native\",\"base_path\":\"$W/files\",\"num_workers\":4,\"use_odirect\":true}"; fi
  for only in store load; do
    # load-only needs stored keys: store first (untraced), then trace the phase
    ( cd $W && timeout 300 strace -f -c -o $OUT/strace-$row-$only.txt lmcache bench l2 --l2-adapter "$spec" --num-keys 32 --in-flight 4 --data-size-kb 256 --l1-align-bytes 4096 --rounds 8 --warmup-rounds 1 --lookup-max-hit-rate 1.0 --no-skip-verify --format json --output $OUT/bench-$row-$only.json -q --only $only > $OUT/bench-$row-$only.log 2>&1 )
  done
done
rm -rf $W
