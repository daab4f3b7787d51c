#!/usr/bin/env bash
# bench_index at 1 M objects with the anonymous-memory count (session 22, abtool), under the bench lock.
for s in HUP INT TERM PIPE; do trap "echo got $s >> /tmp/abtool-index/sig" $s; done
cd /work/wt-abtool || exit 1
flock /work/bench.lock /tmp/abtool-index/inner.sh
echo "flock rc $?"
