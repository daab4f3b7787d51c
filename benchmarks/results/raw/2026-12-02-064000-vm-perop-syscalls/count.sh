#!/bin/bash
# count.sh SIZE_KB W N tag : gateway and client under strace -f -c, segments path
set -e
S=$1; W=$2; N=$3; T=$4
D=/dev/shm/perop-gw-$T; rm -rf $D; mkdir -p $D
truncate -s 1G $D/card.img
cd /work/wt-perop
python -c "from lmcache_adp import format_card; format_card('$D/card.img',0,64<<20)" 2>/dev/null
strace ${GWSTRACE:--f -c} -o /tmp/perop/strace-gw-$T.txt python -m lmcache_adp.cli gateway --card $D/card.img --socket $D/gw.sock --io-contexts $W > $D/gw.log 2>&1 &
SP=$!
for i in $(seq 100); do grep -q "gateway ready" $D/gw.log && break; sleep 0.2; done
GW_SOCK=$D/gw.sock strace -f -c -o /tmp/perop/strace-cl-$T.txt python /tmp/perop/probe.py ext $S $W $N 2>/dev/null
kill -TERM $(pgrep -P $SP) ; wait $SP || true
rm -rf $D
