#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# usage: exp.sh REPS  (runs with a one-core busy loop alongside)
cd /tmp/rs
python -c 'while 1: pass' & HOG=$!
run() { rm -rf /tmp/rs/w; timeout 300 python probe_retrieve.py "$@" 2>&1 | grep -E "^(adp|mock)|Error" | sed "s/ok=True//"; }
for r in 1 2; do
run adp /tmp/rs/w $1 --shm
SERVER_ENV=OMP_WAIT_POLICY=PASSIVE run adp /tmp/rs/w $1 --shm
run mock /tmp/rs/w $1 --shm
run adp /tmp/rs/w $1
done
kill $HOG
