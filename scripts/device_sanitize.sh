#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sanitizer stress for a many-core machine (the `device` tool's 16 cores), where
# interleavings show that the 2-core VM does not reach. One script for every
# session's run, instead of a copy under benchmarks/results/raw/ each time:
#
#   1. scripts/sanitize.sh asan, then tsan (connector_stress on a disk card in
#      CARD_DIR), each repeated for SECONDS;
#   2. the sanitizer test entries of tests/sanitizers/ that match the pytest
#      -k expression EXPR (default: every test marked sanitizer but the slow
#      ones), ROUNDS times, each round a fresh pytest run.
#
#   scripts/device_sanitize.sh OUTDIR SECONDS ROUNDS [EXPR]
#
# OUTDIR gets summary.txt (one line per loop and per round) and the logs of
# what failed (the last two logs of each passing loop are kept). Exits non-zero
# when anything failed, or when EXPR selects no test (pytest's exit 5). pytest: the machine's own, else a directory on
# PYTHONPATH; on a machine with no registry, install it here and carry it:
#   python3 -m pip install --target .device-py pytest   (.device-py is ignored)
# The tests need no built lmcache_adp (they compile tests/cpp/ programs), so
# ADP_ALLOW_STALE_NATIVE=1 lets conftest run without it.
set -uo pipefail

out=${1:?usage: $0 OUTDIR SECONDS ROUNDS [EXPR]}
seconds=${2:?usage: $0 OUTDIR SECONDS ROUNDS [EXPR]}
rounds=${3:?usage: $0 OUTDIR SECONDS ROUNDS [EXPR]}
expr=${4:-not slow}
cd "$(dirname "$0")/.."
[ -d .device-py ] && export PYTHONPATH="$PWD/.device-py${PYTHONPATH:+:$PYTHONPATH}"
export ADP_ALLOW_STALE_NATIVE=1 PYTHON=${PYTHON:-python3}
card_dir=${CARD_DIR:-/var/tmp/adp-san}
mkdir -p "$out" "$card_dir"
summary=$out/summary.txt
failed=0
{ echo "$(nproc) cores; $(g++ --version | head -1); $(git rev-parse --short HEAD 2>/dev/null || echo no-git)"; } > "$summary"

loop() { # mode tag
  local mode=$1 tag=$2 n=0 start=$SECONDS
  [ "$seconds" -gt 0 ] || { echo "$tag: not run (SECONDS 0)" >> "$summary"; return; }
  while [ $((SECONDS - start)) -lt "$seconds" ]; do
    n=$((n + 1))
    if ! timeout 300 scripts/sanitize.sh "$mode" "$card_dir" > "$out/$tag-$n.log" 2>&1; then
      echo "$tag: run $n FAILED (log $tag-$n.log)" >> "$summary"
      failed=1
      return
    fi
    [ $n -gt 2 ] && rm -f "$out/$tag-$((n - 2)).log"
  done
  echo "$tag: $n passed in $((SECONDS - start)) s" >> "$summary"
}
loop asan asan-disk
loop tsan tsan-disk

for r in $(seq 1 "$rounds"); do
  log=$out/entries-$r.log
  start=$SECONDS
  if $PYTHON -m pytest -q -p no:cacheprovider -m sanitizer -k "$expr" tests/sanitizers > "$log" 2>&1; then
    echo "entries round $r: $(tail -1 "$log") ($((SECONDS - start)) s)" >> "$summary"
    [ "$r" -gt 1 ] && rm -f "$out/entries-$((r - 1)).log"
  else
    echo "entries round $r FAILED: $(tail -1 "$log") (log entries-$r.log)" >> "$summary"
    failed=1
  fi
done
cat "$summary"
exit $failed
