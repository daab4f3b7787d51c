#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Probe (issue 10, load36): a load phase long enough to attach strace or perf to. Writes a card image under DIR,
reads it with the medium's O_DIRECT (bench_connector's medium_pass, 3 passes), stores N objects of SIZE KiB through
an embedded ADPConnector (W workers, io_depth W), then loads them over and over with bench_connector's drive()
(batches of 2 x W keys, 4 in flight) for SECS seconds, every loaded byte checked at the end. It prints
"LOADING <pid>" when the loads begin; attach then, e.g. (load36's numbers: results/2026-12-07-*-load36-*.md):

  python benchmarks/probes/load_phase.py /var/tmp/lp 8 > lp.out & \\
    until grep -q LOADING lp.out; do sleep 0.2; done; sleep 0.5
  strace -f -c -p $(awk '/LOADING/ {print $2}' lp.out) -o strace.txt & sleep 4; kill -INT $!
  perf record -F 2000 -g -p <pid> -- sleep 4     # or: strace -k -e trace=futex -p <a worker's tid>

  python benchmarks/probes/load_phase.py DIR SECS [W] [SIZE_KB]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    d, secs = Path(argv[0]), float(argv[1])
    workers = int(argv[2]) if len(argv) > 2 else 2
    size = (int(argv[3]) if len(argv) > 3 else 256) * 1024
    n = max(64, (256 << 20) // size)
    d.mkdir(parents=True, exist_ok=True)
    card = d / "card.img"
    region = bc.region_for(size)
    bc.prefill(card, bc.card_bytes_for(n * size, size, workers, region))
    src, dst = bc.aligned_buffers(n, size), bc.aligned_buffers(n, size)
    bc.fill_sources(src, 7)
    t = [bc.medium_pass(card, dst, workers, False) for _ in range(3)]
    print("medium O_DIRECT read GB/s", [round(n * size / x / 1e9, 2) for x in t], flush=True)
    bc.format_card(str(card), 0, region)
    conn = bc.ADPConnector(card=str(card), num_workers=workers, io_depth=workers, timeout_ms=60000)
    try:
        keys = [f"probe@00000000@0@{j:06x}" for j in range(n)]
        assert bc.drive(conn, "set", keys, src, workers * 2, 4)[1] == 0
        print("LOADING", os.getpid(), flush=True)
        t0, reps, spent = time.time(), 0, 0.0
        while time.time() - t0 < secs:
            dt, failed = bc.drive(conn, "get", keys, dst, workers * 2, 4)
            assert failed == 0
            spent, reps = spent + dt, reps + 1
        print(f"embedded load GB/s {reps * n * size / spent / 1e9:.2f} ({reps} passes of {n} keys)", flush=True)
        assert bc.same(dst, src) == 0
    finally:
        conn.close()
        card.unlink()


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    here = Path(__file__).resolve().parents[1]  # benchmarks/
    sys.path.insert(0, str(here))
    from tools import use_own_tree

    use_own_tree(here.parent)  # this tree's package when built in place, before bench_connector imports one
    import bench_connector as bc

    main(sys.argv[1:])
