#!/bin/bash
# One timed pytest run of the sanitized crash-harness entries in tree $1 (main's: before; citime29's: after),
# output to $2. Run under flock /work/bench.lock. Objects prebuilt in each tree (build/sanitize), so the times
# are the runs, the links and the session's plain compile, not the sanitized compile of src_cpp.
cd "$1" || exit 1
{ echo "== $(date -u +%H:%M:%S) uptime: $(uptime)"; echo "== tree $1 ($(git -C "$1" log --oneline -1 | cut -c1-60); $(git -C "$1" status --short | wc -l) changed files)"; } >"$2"
/usr/bin/time -f "== wall %e s, user %U s, sys %S s" python -m pytest -q -p no:cacheprovider -m sanitizer tests/sanitizers -k crash_harness --durations=0 >>"$2" 2>&1
echo "== $(date -u +%H:%M:%S) uptime: $(uptime)" >>"$2"
