#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The 16-core rows of issue 10 in one command (benchmarks/README.md, "bench_connector.py"):
#   benchmarks/device_matrix.sh OUT TREE...   (each TREE a source tree of lmcache-adp)
# The first TREE is pip-installed; the others are built in place and measured from their own
# directory (bench_connector.py prefers a tree's in-place build). The default matrix is issue 10's
# paired ratios (benchmarks/README.md, "--interleave"; 6 repetitions, the two orders equally often:
# about 80 s a tree on the 16-core machine, session ten); BENCH_ARGS overrides it, e.g.
# BENCH_ARGS="--workers 4,16 --sizes-mb 2,32 --total-mb 1024 --reps 3" for session seven's unpaired rows.
# Everything lands flat in OUT, so that the device tool, which returns at most 8 files and none more
# than 2 folders below its $OUT, brings it all back from OUT=$OUT/NAME: host.txt (host facts and the
# CRC32C speed), build.log, bench.log and per tree <stamp>-<label>.md and <stamp>-<label>.rows.json
# (bench_connector's raw/<stamp>-<label>/rows.json, moved up): 3 + 2 x trees files.
set -u
out=$1
shift
mkdir -p "$out"
{
  nproc
  lscpu | grep -E "Model name|^L[123]|NUMA node\(s\)|MHz"
  uname -r
  df -hT /dev/shm
  free -g
} > "$out/host.txt" 2>&1
cat "$out/host.txt"
first=1
for tree in "$@"; do
  name=$(basename "$tree")
  if [ $first = 1 ]; then
    (cd "$tree" && ADP_BUILD_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps .) > "$out/build-$name.log" 2>&1 &
  else
    (cd "$tree" && ADP_BUILD_JOBS=16 python3 setup.py -q build_ext --inplace) > "$out/build-$name.log" 2>&1 &
  fi
  first=0
done
wait
for log in "$out"/build-*.log; do  # one file: the device tool returns few
  echo "== $log" | sed "s|$out/build-||"
  cat "$log"
  rm "$log"
done > "$out/build.log"
tail -n 3 "$out/build.log"
(cd /tmp && python3 - <<'PY') | tee -a "$out/host.txt"
import time, numpy as np
from lmcache_adp import crc32c
from lmcache_adp._native import crc32c_implementation
for size in (256 << 10, 2 << 20, 32 << 20):
    b = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    crc32c(b)
    n = max(1, (1 << 30) // size)
    t = time.perf_counter()
    for _ in range(n):
        crc32c(b)
    print(f"crc32c ({crc32c_implementation()}) over {size >> 10} KiB, one thread: {n * size / (time.perf_counter() - t) / 1e9:.1f} GB/s")
PY
args=${BENCH_ARGS:---workers 4,16 --sizes-mb 2,32 --total-mb 1024 --reps 6 --interleave --gateway-rows pieces,process,segments-shm}
for tree in "$@"; do
  name=$(basename "$tree")
  (cd /tmp && timeout 280 python3 "$tree/benchmarks/bench_connector.py" $args --out "$out" --label "16core-$name") \
    > "$out/bench-$name.log" 2>&1
  echo "bench $name: exit $?"
  grep -v INFO "$out/bench-$name.log" | tail -n 14
  { echo "== bench $name"; cat "$out/bench-$name.log"; } >> "$out/bench.log"
  rm "$out/bench-$name.log"
done
# Up from raw/<stamp>-<label>/rows.json (3 folders below the device's $OUT): in the repo it goes back
# there, beside the other runs' raw files, where the report's "Raw:" line points.
for rows in "$out"/raw/*/rows.json; do
  [ -e "$rows" ] || continue
  mv "$rows" "$out/$(basename "$(dirname "$rows")").rows.json"
  rmdir "$(dirname "$rows")"
done
rmdir "$out/raw" 2>/dev/null
# On the device, OUT is the tool's folder: several calls of this script in one command share its 8.
n=$(find "${OUT:-$out}" -type f | wc -l)
[ "$n" -le 8 ] || echo "device_matrix: $n files under ${OUT:-$out}: the device tool returns 8 at most (fewer trees)"
