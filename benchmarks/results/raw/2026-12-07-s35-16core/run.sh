#!/usr/bin/env bash
# session 35 device run: host disk facts, build, item 1/3 on the host's local disk, tmpfs matrix
R=$PWD
O=$OUT/d
mkdir -p $O
{ nproc; lsblk -d -o NAME,ROTA,SIZE,MODEL,TRAN; df -hT / /tmp /var/tmp /dev/shm $R; cat /proc/mounts | grep -E " / | /tmp | /var/tmp "; 
  for q in /sys/block/*/queue; do echo "$q $(cat $q/scheduler 2>/dev/null) $(cat $q/max_sectors_kb) rot=$(cat $q/rotational)"; done; } > $O/disk-host.txt 2>&1
cat $O/disk-host.txt
ADP_BUILD_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps . > $O/build0.log 2>&1; tail -3 $O/build0.log
D=${DISKDIR:-/var/tmp/adp35}
mkdir -p $D
# raw medium check with dd O_DIRECT (no fio there)
dd if=/dev/zero of=$D/dd.img bs=2M count=2048 oflag=direct 2>&1 | tail -1 >> $O/disk-host.txt
dd if=$D/dd.img of=/dev/null bs=2M iflag=direct 2>&1 | tail -1 >> $O/disk-host.txt
rm -f $D/dd.img
tail -2 $O/disk-host.txt
cd /tmp
timeout ${T1:-250} python3 $R/benchmarks/bench_connector.py --dir $D --workers 4,16 --sizes-mb 2,32 --total-mb 2048 --reps 3 --no-gateway --out $O --label 16core-localdisk > $O/bench-disk.log 2>&1
echo "disk rc=$?"; tail -30 $O/bench-disk.log
rm -rf $D
timeout ${T2:-280} python3 $R/benchmarks/bench_connector.py --workers 4,16 --sizes-mb 2,32 --total-mb 1024 --reps 6 --interleave --gateway-rows pieces,process,segments-shm --out $O --label 16core-tmpfs > $O/bench-tmpfs.log 2>&1
echo "tmpfs rc=$?"; tail -30 $O/bench-tmpfs.log
