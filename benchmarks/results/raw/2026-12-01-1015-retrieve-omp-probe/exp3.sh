#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
cd /tmp/rs
python -c 'while 1: pass' & HOG=$!
run() { rm -rf /tmp/rs/w; timeout 300 python probe_retrieve.py "$@" 2>&1 | grep -E "^(adp|mock)|Error" | sed "s/ok=True//" | cut -c1-170; }
for r in 1 2; do
run adp /tmp/rs/w $1 --shm
run adp2 /tmp/rs/w $1 --shm
done
kill $HOG
