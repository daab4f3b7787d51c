#!/bin/bash
# Device stress: card_crash_mt_test sync-fail runs of many seeds, main's tree and 4129c7a's, in parallel.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
FL="-std=c++20 -O2 -g -Wall -Wextra -Wno-missing-field-initializers -pthread"
(cd fix34 && g++ $FL -Isrc_cpp src_cpp/store/*.cc src_cpp/util/*.cc src_cpp/testing/*.cc tests/cpp/card_crash_mt_test.cc -o /tmp/mt_main) &
(cd old4129 && g++ $FL -Isrc_cpp src_cpp/store/*.cc src_cpp/util/*.cc src_cpp/testing/*.cc tests/cpp/card_crash_mt_test.cc -o /tmp/mt_old) &
wait
ls -la /tmp/mt_main /tmp/mt_old || exit 1
DUR=${DUR:-420}; MODE=${MODE:-sync-fail}; N=${N:-7}
end=$(( $(date +%s) + DUR ))
worker() { # tree idx
  local t=$1 i=$2 s=$(( 1000 * $2 + 1 ))
  cd $(mktemp -d)
  while [ $(date +%s) -lt $end ]; do
    /tmp/mt_$t all seed=$s $MODE > o.txt 2> e.txt; rc=$?
    line=$(grep -o "[0-9]* runs, [0-9]* failures" o.txt | tail -1)
    echo "$t seed=$s rc=$rc $line" >> $OUT/summary-$t-$i.txt
    if [ $rc -ne 0 ] || grep -q "FAIL" o.txt; then cp o.txt $OUT/fail-$t-$s.out; tail -c 20000 e.txt > $OUT/fail-$t-$s.err; fi
    s=$((s+1))
  done
}
for i in $(seq 1 $N); do worker main $i & worker old $i & done
wait
cat $OUT/summary-* | awk '{print $1, $3}' | sort | uniq -c
ls $OUT | grep fail || echo "no failures"
