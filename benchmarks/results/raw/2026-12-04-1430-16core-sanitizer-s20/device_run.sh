#!/bin/bash
# session-20 device run: sanitizer stress on 16 cores after exact deletes (header read before the
# tombstone), recovery resumed behind damaged headers, huge-page staging. Run from the repo root.
export PYTHON=python3
nproc > $OUT/summary.txt; g++ --version | head -1 >> $OUT/summary.txt
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
loop asan 80 /var/tmp/adp-san asan-disk
loop tsan 80 /var/tmp/adp-san tsan-disk
python3 - >> $OUT/summary.txt 2>&1 <<'PY'
import time, tempfile
from pathlib import Path
from tests.support import cpp
E = (("store", "util", "connector", "testing"), ("transport/embedded_backend.cc",))
progs = [("collision_delete_test",) + E, ("damage_resume_test", None, ()), ("disk_load_test",) + E,
         ("wait_for_test",) + E]
for mode in ("tsan", "asan"):
    for name, dirs, extra in progs:
        d = Path(tempfile.mkdtemp())
        t = time.time()
        b = cpp.build(name, d, dirs, extra, sanitize=mode) if dirs else cpp.build(name, d, sanitize=mode)
        ok = 0
        for i in range(5):
            try:
                cpp.run(b, timeout=300); ok += 1
            except AssertionError as e:
                print(f"{name} {mode} run {i} FAILED:", str(e)[-2000:]); break
        print(f"{name} under {mode}: {ok}/5 passed in {time.time()-t:.0f} s", flush=True)
PY
cat $OUT/summary.txt
