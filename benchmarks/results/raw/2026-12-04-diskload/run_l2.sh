#!/bin/bash
# bench_l2 on disk: ADP (this tree: huge-page staging) + ADP before (main 92de455) + fs_native O_DIRECT, same run
cd /work/wt-diskload
echo "start $(date -u +%FT%TZ) uptime: $(uptime)"
flock /work/bench.lock python benchmarks/bench_l2.py --medium disk --sizes-kb 256,2048 --passes ${PASSES:-4} \
  --row ADP --row "fs_native O_DIRECT" --extra-adp before=/var/tmp/diskload/before --dir /var/tmp/diskload/l2
echo "end $(date -u +%FT%TZ) uptime: $(uptime)"
