#!/bin/bash
# session-18 device run: sanitizer stress on 16 cores (not committed)
cd "$(dirname "$0")"; export PYTHON=python3
nproc > $OUT/summary.txt; g++ --version | head -1 >> $OUT/summary.txt; git log --oneline -1 >> $OUT/summary.txt 2>/dev/null
df -T /var/tmp /dev/shm >> $OUT/summary.txt 2>&1
loop() { # mode seconds card_dir tag
  local mode=$1 lim=$2 dir=$3 tag=$4 n=0 start=$SECONDS
  while [ $((SECONDS-start)) -lt $lim ]; do
    n=$((n+1))
    if ! timeout 150 scripts/sanitize.sh $mode $dir > $OUT/$tag-$n.log 2>&1; then echo "$tag: run $n FAILED" >> $OUT/summary.txt; tail -40 $OUT/$tag-$n.log > $OUT/$tag-FAIL.txt; return; fi
    [ $n -gt 2 ] && rm -f $OUT/$tag-$((n-2)).log
  done
  echo "$tag: $n passed in $((SECONDS-start)) s" >> $OUT/summary.txt
}
mkdir -p /var/tmp/adp-san
loop asan 150 /dev/shm asan-shm
loop asan 70 /var/tmp/adp-san asan-disk
loop tsan 110 /dev/shm tsan-shm
python3 - >> $OUT/summary.txt 2>&1 <<'PY'
import time, tempfile
from pathlib import Path
from tests.support import cpp
for mode in ("tsan", "asan"):
    d = Path(tempfile.mkdtemp())
    t = time.time(); b = cpp.build("group_sync_test", d, ("util", "testing"), sanitize=mode)
    ok = 0
    for i in range(5):
        try:
            cpp.run(b, timeout=300); ok += 1
        except AssertionError as e:
            print(f"group_sync_test {mode} run {i} FAILED:", str(e)[-2000:]); break
    print(f"group_sync_test under {mode}: {ok}/5 passed in {time.time()-t:.0f} s")
PY
start=$SECONDS
if timeout 200 scripts/sanitize.sh asan-python > $OUT/asan-python.log 2>&1; then echo "asan-python: passed in $((SECONDS-start)) s" >> $OUT/summary.txt; else echo "asan-python: rc=$? in $((SECONDS-start)) s" >> $OUT/summary.txt; fi
cat $OUT/summary.txt
