#!/usr/bin/env bash
# session 35: the sanitizer suite on 16 cores, in four parallel parts
R=$PWD; O=$OUT/s; mkdir -p $O
export PYTHONPATH=$R/.device-py ADP_ALLOW_STALE_NATIVE=1
git log --oneline -1 > $O/tree.txt 2>&1 || true
A="embedded_card_program or stress or crash_harness"
start=$(date +%s)
for m in asan tsan; do
  (timeout 560 python3 -m pytest -q -m sanitizer tests/sanitizers -p no:cacheprovider -k "$m and ($A)" > $O/san-$m-1.log 2>&1; echo "rc=$? $(( $(date +%s) - start ))s" >> $O/san-$m-1.log) &
  (timeout 560 python3 -m pytest -q -m sanitizer tests/sanitizers -p no:cacheprovider -k "$m and not ($A)" > $O/san-$m-2.log 2>&1; echo "rc=$? $(( $(date +%s) - start ))s" >> $O/san-$m-2.log) &
done
wait
for f in $O/san-*.log; do echo "== $f"; grep -E "passed|failed|^FAILED|^ERROR|rc=" $f | tail -8; done
