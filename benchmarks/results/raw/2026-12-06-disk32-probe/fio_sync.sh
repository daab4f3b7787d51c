#!/bin/bash
# fio QD4 O_DIRECT sequential writes (bench_l2's job) of BS without a sync and with --fdatasync=N for each N in
# SYNCS, interleaved ABC CBA, PASSES times. Usage: fio_sync.sh FILE OUTDIR BS "SYNCS" PASSES
set -u
F=$1; O=$2; BS=$3; SYNCS=$4; P=$5
uptime
one() {
  local n=$1 i=$2 extra=""
  [ "$n" != 0 ] && extra="--fdatasync=$n"
  fio --name=w --filename=$F --filesize=2147483648 --size=536870912 --offset_increment=536870912 --numjobs=4 \
    --iodepth=1 --ioengine=psync --direct=1 --bs=$BS --rw=write --end_fsync=1 --group_reporting \
    --output-format=json $extra --output=$O/fio-$BS-sync$n-$i.json
  python3 -c "import json; j=json.load(open('$O/fio-$BS-sync$n-$i.json'))['jobs'][0]; print('$BS fdatasync=$n pass $i: %.0f MiB/s, syncs %d' % (j['write']['bw_bytes']/2**20, j.get('sync', {}).get('lat_ns', {}).get('N', 0)))"
}
for i in $(seq 1 $P); do
  if [ $((i % 2)) = 1 ]; then for n in 0 $SYNCS; do one $n $i; done
  else for n in $(echo $SYNCS | tr ' ' '\n' | tac) 0; do one $n $i; done; fi
done
uptime
