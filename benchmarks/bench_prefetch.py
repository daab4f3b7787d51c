#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One LMCache prefetch at the connector: the card against what LMCache's RAM L2 does, in one run.

LMCache's MP server prefetches a prompt from L2 with one load task holding every chunk
(prefetch_controller._submit_load_tasks); NativeConnectorL2Adapter turns it into one
submit_batch_get. The RAM L2 (`mock`) serves the same task with torch `copy_` per chunk,
in one thread of its event loop (torch's intra-op threads inside each copy). This script
times both on the same warm destination tensors, alternating, without the MP server
around them (which on a shared 2-core VM adds more noise than the copy costs):

  card   ADPConnector(card=<tmpfs image>, num_workers=W): submit_batch_get of N objects,
         waited for on the eventfd and drained as the adapter's demux thread does
  mock   dst.copy_(src) for the same N objects (what MockL2Adapter._execute_load_in_loop does)

Every loaded byte is compared with its source after the timed rounds.

    python benchmarks/bench_prefetch.py --objects 32 --object-mb 32 --workers 4 --reps 9
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import torch

from lmcache_adp import ADPConnector

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tools import card_against_peer, print_rounds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=32, help="chunks of the prompt (default 32: 1 GiB at 32 MiB)")
    ap.add_argument("--object-mb", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4, help="ADPConnector num_workers (bench_restore uses 4)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--dir", default="/dev/shm", help="where the card image lives (tmpfs: a memory-speed card)")
    args = ap.parse_args()
    n, size = args.objects, args.object_mb << 20
    work = tempfile.mkdtemp(dir=args.dir, prefix="adp-bench-prefetch-")
    conn = ADPConnector(
        card=os.path.join(work, "card.img"), card_size_gb=max(1, 4 * n * size / 2**30), num_workers=args.workers
    )
    try:
        keys = [f"m@00000000@0@{i:x}" for i in range(n)]
        src = [torch.randint(0, 256, (size,), dtype=torch.uint8) for _ in range(n)]
        dst = [torch.ones(size, dtype=torch.uint8) for _ in range(n)]  # touched, as L1's arena is

        def mock_round() -> None:
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)

        src_views, views = [memoryview(s.numpy()) for s in src], [memoryview(d.numpy()) for d in dst]
        times = card_against_peer(conn, keys, src_views, views, "mock", mock_round, args.reps)
    finally:
        conn.close()
        shutil.rmtree(work, ignore_errors=True)
    gib = n * size / 2**30
    about = f"{n} objects of {args.object_mb} MiB ({gib:.2f} GiB), card workers {args.workers}"
    print_rounds(times, gib, f"{about}, torch threads {torch.get_num_threads()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
