#!/bin/bash
# The programs alone (no pytest): each sanitized entry's program with `quick` in one process (main's binary, no
# shard: the work of the entry before) and split (this branch's binary, shard=0/2 and shard=1/2 at once), each
# process under /usr/bin/time; then the plain quick runs. Binaries: /tmp/citime29/bin-{before,after}/<mode>/
# (tests/support/cpp.py's build). Order per program: single first, then split ($1=ba: split first).
export ADP_LOG_LEVEL=ERROR
B=/tmp/citime29/bin-before A=/tmp/citime29/bin-after
T='%e s wall, %U user, %S sys'
echo "== $(date -u +%H:%M:%S) uptime: $(uptime)"
for mode in asan tsan; do for name in card_crash_aligned_test card_crash_fill_test; do
  single() { s=$(date +%s.%N); /usr/bin/time -f "single $T" $B/$mode/$name quick 2>&1 | grep -E "runs,|single "; echo "$mode $name single wall $(echo "$(date +%s.%N) - $s" | bc)"; }
  split() { s=$(date +%s.%N)
    /usr/bin/time -f "shard0 $T" $A/$mode/$name quick shard=0/2 >/tmp/citime29/s0.out 2>&1 &
    /usr/bin/time -f "shard1 $T" $A/$mode/$name quick shard=1/2 >/tmp/citime29/s1.out 2>&1; wait
    echo "$mode $name split wall $(echo "$(date +%s.%N) - $s" | bc)"; grep -hE "runs,|shard[01] |: PASS" /tmp/citime29/s0.out /tmp/citime29/s1.out; }
  if [ "$1" = ba ]; then split; single; else single; split; fi
done; done
for name in card_crash_aligned_test card_crash_fill_test; do /usr/bin/time -f "plain $name quick $T" $B/plain/$name quick 2>&1 | grep -E "runs,|plain "; done
echo "== $(date -u +%H:%M:%S) uptime: $(uptime)"
