#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# One bench_restore run (tiers given) with diskstat_sampler.py beside it; run under flock /work/bench.lock.
#   run_sampled.sh TAG TIERS
set -e
R=$(dirname "$0")
TAG=$1; TIERS=${2:-fs_native,adp,mock}
python "$R/diskstat_sampler.py" "/var/tmp/r37-samples-$TAG.tsv" &
S=$!
uptime
python benchmarks/bench_restore.py --workdir /var/tmp/r37-$TAG --rounds 1 --tiers "$TIERS" \
  --server-env OMP_WAIT_POLICY=PASSIVE --tag "$TAG" || echo "bench rc=$?"
kill $S; wait $S || true
uptime
