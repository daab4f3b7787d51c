#!/bin/bash
# bench_l2 on disk, 2 MiB: ADP (this tree: huge-page staging, objects <= 4 MiB staged) + ADP straight2m (the same,
# aligned objects > 1 MiB read straight into L1) + ADP before (main 92de455) + fs_native O_DIRECT, same run
cd /work/wt-diskload
echo "start $(date -u +%FT%TZ) uptime: $(uptime)"
flock /work/bench.lock python benchmarks/bench_l2.py --medium disk --sizes-kb ${SIZES:-2048} --passes ${PASSES:-4} \
  --row ADP --row "fs_native O_DIRECT" --extra-adp before=/var/tmp/diskload/before \
  --extra-adp straight2m=/var/tmp/diskload/straight --dir /var/tmp/diskload/l2
echo "end $(date -u +%FT%TZ) uptime: $(uptime)"
