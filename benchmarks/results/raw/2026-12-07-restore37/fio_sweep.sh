#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# fio: 32 MiB O_DIRECT sequential reads on /var/tmp at 1, 2, 4, 8, 16 in flight, as psync jobs (each its own
# share of the file) and as one libaio job at that iodepth; two rounds, the second in reverse order. Besides
# fio's rate and completion latency, the disk's own view over each cell (/proc/diskstats deltas): requests
# completed, their mean size, and the mean read requests in flight (ms reading / ms elapsed).
set -e
D=${D:-/var/tmp/r37-fio}
F=$D/fio.dat
mkdir -p $D
[ -f $F ] || fio --name=mk --filename=$F --size=2G --rw=write --bs=32M --direct=1 --ioengine=psync >/dev/null
uptime
CONFIGS=("psync 1 1" "psync 1 2" "psync 1 4" "psync 1 8" "psync 1 16" "libaio 1 1" "libaio 2 1" "libaio 4 1" "libaio 8 1" "libaio 16 1")
disk() { awk '$3=="vda"{print $4, $6, $7}' /proc/diskstats; }
run() { # engine qd jobs
  local eng=$1 qd=$2 jobs=$3
  local share=$(( (2048 / jobs) / 32 * 32 ))M
  read r0 s0 m0 < <(disk); t0=$(date +%s.%N)
  out=$(fio --name=q --filename=$F --rw=read --bs=32M --direct=1 --ioengine=$eng --iodepth=$qd \
    --numjobs=$jobs --size=$share --offset_increment=$share --group_reporting --time_based --runtime=4 \
    --output-format=json 2>/dev/null)
  read r1 s1 m1 < <(disk); t1=$(date +%s.%N)
  python3 -c "
import json,sys
j=json.loads(sys.stdin.read()); r=j['jobs'][0]['read']
reqs=$r1-$r0; sect=$s1-$s0; ms=$m1-$m0; dt=$t1-$t0
print('32M %-6s qd=%-3s jobs=%-3s %6.0f MiB/s  clat mean %6.1f ms | disk: %5d requests of %.2f MiB, %.2f reads in flight' % ('$eng','$qd','$jobs', r['bw']/1024, r['clat_ns']['mean']/1e6, reqs, sect*512/reqs/2**20 if reqs else 0, ms/1e3/dt))" <<<"$out"
}
for round in 1 2; do
  echo "round $round $(date -u +%T)"
  if [ $round = 1 ]; then list=("${CONFIGS[@]}"); else list=(); for ((i=${#CONFIGS[@]}-1;i>=0;i--)); do list+=("${CONFIGS[$i]}"); done; fi
  for c in "${list[@]}"; do run $c; done
done
uptime
