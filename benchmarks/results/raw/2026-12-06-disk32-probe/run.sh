#!/bin/bash
# One flock hold: the rounds probe (all modes, PASSES passes) and fio QD4 256 KiB O_DIRECT writes without and with
# ADP's sync rate (--fdatasync=32: one a job every 32 writes = 8 MiB, as one put_slices sync a worker a round),
# interleaved. Usage: run.sh FILE OUTDIR PASSES
set -u
F=$1; O=$2; P=${3:-3}
uptime > $O/uptime-start.txt
fiojob() { # $1 label, rest: extra args
  local l=$1; shift
  fio --name=w --filename=$F --filesize=2147483648 --size=536870912 --offset_increment=536870912 --numjobs=4 \
    --iodepth=1 --ioengine=psync --direct=1 --bs=256k --rw=write --end_fsync=1 --group_reporting \
    --output-format=json "$@" --output=$O/fio-$l.json
  python3 -c "import json,sys; j=json.load(open('$O/fio-$l.json'))['jobs'][0]['write']; print('fio $l: %.0f MiB/s' % (j['bw_bytes']/2**20))"
}
for i in $(seq 1 $P); do
  fiojob nosync-$i
  fiojob fdatasync32-$i --fdatasync=32
  /tmp/sdr32 $F 1
  fiojob fdatasync32b-$i --fdatasync=32
  fiojob nosyncb-$i
done
uptime > $O/uptime-end.txt
