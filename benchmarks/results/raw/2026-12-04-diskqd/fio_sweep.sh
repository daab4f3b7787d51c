#!/bin/bash
# fio sweep: O_DIRECT reads on /var/tmp, queue depths, 2 rounds, second in reverse order.
set -e
D=/var/tmp/diskqd
F=$D/fio.dat
[ -f $F ] || fio --name=mk --filename=$F --size=2G --rw=write --bs=32M --direct=1 --ioengine=psync >/dev/null
uptime
CONFIGS=(
 "32M libaio 1 1" "32M libaio 2 1" "32M libaio 4 1" "32M libaio 8 1"
 "2M libaio 1 1" "2M libaio 2 1" "2M libaio 4 1" "2M libaio 8 1" "2M libaio 16 1"
 "8M libaio 4 1" "8M libaio 8 1" "8M libaio 16 1" "4M libaio 8 1" "4M libaio 32 1"
 "32M psync 1 2" "32M psync 1 4" "8M psync 1 4" "8M psync 1 16" "2M psync 1 4"
)
run() { # bs engine qd jobs rw
  local bs=$1 eng=$2 qd=$3 jobs=$4 rw=$5
  out=$(fio --name=q --filename=$F --size=2G --rw=$rw --bs=$bs --direct=1 --ioengine=$eng --iodepth=$qd \
    --numjobs=$jobs --group_reporting --time_based --runtime=4 --ramp_time=0.5 --output-format=json 2>/dev/null)
  python3 -c "
import json,sys
j=json.loads(sys.stdin.read()); r=j['jobs'][0]['read']
print('%-5s %-6s qd=%-3s jobs=%-3s %-8s %6.0f MiB/s  clat mean %7.1f ms  p99 %7.1f ms' % ('$bs','$eng','$qd','$jobs','$rw', r['bw']/1024, r['clat_ns']['mean']/1e6, r['clat_ns']['percentile']['99.000000']/1e6))" <<<"$out"
}
for round in 1 2; do
  echo "round $round"
  if [ $round = 1 ]; then list=("${CONFIGS[@]}"); else list=(); for ((i=${#CONFIGS[@]}-1;i>=0;i--)); do list+=("${CONFIGS[$i]}"); done; fi
  for c in "${list[@]}"; do
    for rw in read randread; do run $c $rw; done
  done
done
uptime
