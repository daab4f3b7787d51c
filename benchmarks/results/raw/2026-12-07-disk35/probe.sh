#!/bin/bash
# Session 35 (brief disk35): the sync schedules of benchmarks/probes/store_disk_rounds.cc, interleaved, on /var/tmp.
# One flock hold: prefill the file, then PASSES passes of PROBE_MODES (every other pass reversed), 256 MiB a mode.
# Usage (repository root): flock /work/bench.lock benchmarks/results/raw/2026-12-07-disk35/probe.sh FILE OUT PASSES [OBJ_KiB]
set -eu
F=$1; O=$2; P=${3:-40}; K=${4:-256}
g++ -O2 -std=c++20 -march=native -pthread -Isrc_cpp -o /tmp/sdr35 benchmarks/probes/store_disk_rounds.cc \
  src_cpp/util/crc32c.cc src_cpp/util/crc_worker.cc src_cpp/util/group_sync.cc src_cpp/util/status.cc
[ -f $F ] || dd if=/dev/zero of=$F bs=64M count=5 oflag=direct status=none
{ date -u; uptime; } > $O
# bench_l2's geometry (THREADS and SLICE_OBJS from the environment, default 4 and 8): 4 threads, rounds of 32 MiB at 256 KiB (4 batches x 32 keys), a worker slice 8 objects
# (2 MiB); at 2 MiB a round is 256 MiB (4 x 32 x 2 MiB) and a slice 16 MiB, so PASS_MiB 1024 (4 rounds).
if [ "$K" = 256 ]; then RM=32; PM=256; else RM=256; PM=1024; fi
[ -f $F.big ] || [ "$K" = 256 ] || dd if=/dev/zero of=$F.big bs=64M count=17 oflag=direct status=none
FF=$F; [ "$K" = 256 ] || FF=$F.big
OBJ_KiB=$K ROUND_MiB=$RM REGION_MiB=32 PASS_MiB=$PM SLICE_OBJS=${SLICE_OBJS:-8} PROBE_MODES=${MODES:-RPTJKA} /tmp/sdr35 $FF $P >> $O
{ date -u; uptime; } >> $O
