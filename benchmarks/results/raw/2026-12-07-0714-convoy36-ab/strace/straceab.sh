#!/bin/sh
# $1 = tree (package dir parent), $2 = tag
cd /work/wt-convoy36
rm -rf /dev/shm/c36-lp; 
ADP_ALLOW_STALE_NATIVE=1 PYTHONPATH=$1 python benchmarks/probes/load_phase.py /dev/shm/c36-lp 9 2 256 > /tmp/c36/lp-$2.out 2>&1 &
LP=$!
until grep -q LOADING /tmp/c36/lp-$2.out; do sleep 0.2; done; sleep 0.5
timeout -s INT 4 strace -f -c -p $(awk '/LOADING/ {print $2}' /tmp/c36/lp-$2.out) -o /tmp/c36/strace-$2.txt
wait $LP
rm -rf /dev/shm/c36-lp
