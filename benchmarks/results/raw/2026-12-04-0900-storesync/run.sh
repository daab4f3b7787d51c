#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Interleaved before/after runs of benchmarks/probe_store_sync.py on this VM's disk, with fio's O_DIRECT write
# as the peer in each round: OLD = main 0a2ddb2 (git archive + main's built _native .so, /var/tmp/ss-old), NEW =
# a copy of the storesync worktree with its built .so (/var/tmp/ss-new; the first run, probe/, used the worktree itself, NEW_TREE=/work/wt-storesync). Each tree's bench_connector imports that tree's own package.
# usage: run.sh OUTDIR DIR "old new new old ..." REPS     (run under flock /work/bench.lock)
set -u
OUT=$1; DIR=$2; ORDER=$3; REPS=${4:-5}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" "$DIR"
declare -A TREE=([old]=/var/tmp/ss-old [new]=${NEW_TREE:-/var/tmp/ss-new})
fio_peer() {  # $1 tag: 2 jobs (= workers) of O_DIRECT sequential writes, 512 MiB each, for each block size
  for bs in 2M 256k; do
    for sync in end "2"; do
      if [ "$sync" = end ]; then s="--end_fsync=1"; else s="--fdatasync=$sync"; fi
      fio --name=w --filename="$DIR/fio.img" --rw=write --bs=$bs --size=512M --offset_increment=512M --numjobs=2 \
        --direct=1 --ioengine=psync --group_reporting $s --output-format=json > "$OUT/$1-fio-$bs-sync$sync.json" 2>&1
      python3 - "$OUT/$1-fio-$bs-sync$sync.json" "$bs" "$sync" <<'PY' >> "$OUT/fio.txt"
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: bs {sys.argv[2]} sync {sys.argv[3]}: {j['bw_bytes'] / 1e9:.2f} GB/s")
PY
    done
  done
}
i=0
for who in $ORDER; do
  i=$((i+1))
  tag="$i-$who"
  fio_peer "$tag"
  {
    echo "### $tag: ${TREE[$who]}  $(date -u +%FT%TZ)"
    echo "uptime before: $(uptime)"
    (cd "${TREE[$who]}/benchmarks" && python "$HERE/build_line.py")
  } > "$OUT/$tag.txt" 2>&1
  (cd "${TREE[$who]}" && python benchmarks/probe_store_sync.py --dir "$DIR" --sizes-mb "${SIZES:-2,0.25}" \
     --workers 2 --reps "$REPS" --out "$OUT/$tag.json") 2>&1 | grep -v ' INFO: ' >> "$OUT/$tag.txt"
  echo "uptime after: $(uptime)" >> "$OUT/$tag.txt"
done
rm -f "$DIR/fio.img"
