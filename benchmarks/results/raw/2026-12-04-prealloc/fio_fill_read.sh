#!/bin/bash
# The medium alone, as the card uses it: a new 4 GiB file, sparse or fallocate'd, first filled by 4 psync
# O_DIRECT jobs (each its own quarter, sequential, BS), then read back the same way; 4 rounds, the order of
# the two kinds swapped every round. MiB/s of the fill and the read, the file's extent count after the fill.
set -u
D=/var/tmp/prealloc-fio2; mkdir -p $D; f=$D/img
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="sparse falloc"; else order="falloc sparse"; fi
  for bs in 256k 2M; do for k in $order; do
    rm -f $f
    if [ $k = sparse ]; then truncate -s 4G $f; else fallocate -l 4G $f; fi
    w=$(fio --name=w --filename=$f --rw=write --bs=$bs --direct=1 --ioengine=psync --numjobs=4 --size=1G \
        --offset_increment=1G --group_reporting --output-format=json | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"]/2**20))')
    ext=$(filefrag $f | sed 's/.*: //')
    rd=$(fio --name=r --filename=$f --rw=read --bs=$bs --direct=1 --ioengine=psync --numjobs=4 --size=1G \
        --offset_increment=1G --group_reporting --output-format=json | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/2**20))')
    echo "round $r $bs $k: fill $w MiB/s, read $rd MiB/s, $ext, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%T)"
  done; done
done
rm -rf $D
