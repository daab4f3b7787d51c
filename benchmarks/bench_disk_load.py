#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One prompt's load from a disk card at the connector, beside plain O_DIRECT reads, in one run.

The L2->L1 phase of bench_restore.py without the MP server around it (which on a
shared 2-core VM adds more noise than the plugin costs): one submit_batch_get of
all the prompt's chunks into warm, 4 KiB aligned buffers (LMCache's L1 with
--l1-align-bytes 4096), against what fs_native with O_DIRECT does with the same
number of workers: W threads, each taking the next object and reading it with
one os.preadv (O_DIRECT) of the whole object into its buffer, no checksum. Both
on the same disk, alternating round by round; the card's loaded bytes are
compared with the stored ones after the timed rounds.

    python benchmarks/bench_disk_load.py --dir /var/tmp --objects 32 --object-mb 32 --workers 4 --reps 7

Prints one line per row and `card / O_DIRECT`, the median of the per-round ratios.
Compare the card with the O_DIRECT row of the same run only.
"""

from __future__ import annotations

import argparse
import mmap
import os
import queue
import shutil
import sys
import tempfile
import threading

import numpy as np

from lmcache_adp import ADPConnector

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tools import card_against_peer, print_rounds  # noqa: E402


def aligned(n: int) -> np.ndarray:
    """n bytes of page-aligned, touched memory."""
    buf = np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8)
    buf[:] = 1
    return buf


def odirect_round(path: str, dst: list[np.ndarray], workers: int) -> None:
    """W threads read the objects, one preadv of a whole object each, into dst (as fs_native's workers)."""
    size = len(dst[0])
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(dst)):
        todo.put(i)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)

    def run() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            if os.preadv(fd, [memoryview(dst[i])], i * size) != size:
                raise RuntimeError("short read")

    try:
        threads = [threading.Thread(target=run) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp", help="a directory on the disk under test")
    ap.add_argument("--objects", type=int, default=32, help="chunks of the prompt (default 32: 1 GiB at 32 MiB)")
    ap.add_argument("--object-mb", type=int, default=32)
    ap.add_argument("--object-kb", type=int, help="object size in KiB (overrides --object-mb)")
    ap.add_argument("--workers", type=int, default=4, help="ADPConnector num_workers = io_depth = O_DIRECT threads")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    n, w = args.objects, args.workers
    size = args.object_kb << 10 if args.object_kb else args.object_mb << 20
    work = tempfile.mkdtemp(dir=args.dir, prefix="adp-bench-disk-load-")
    conn = ADPConnector(
        card=os.path.join(work, "card.img"), card_size_gb=max(2, 4 * n * size / 2**30), num_workers=w, io_depth=w
    )
    try:
        keys = [f"m@00000000@0@{i:x}" for i in range(n)]
        rng = np.random.default_rng(0)
        src = [aligned(size) for _ in range(n)]
        for s in src:
            s[:] = rng.integers(0, 256, size, dtype=np.uint8)
        peer = os.path.join(work, "odirect.dat")
        fd = os.open(peer, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
        for i, s in enumerate(src):
            os.pwritev(fd, [memoryview(s)], i * size)
        os.fsync(fd)
        os.close(fd)
        dst = [aligned(size) for _ in range(n)]

        src_views, views = [memoryview(s) for s in src], [memoryview(d) for d in dst]
        times = card_against_peer(
            conn, keys, src_views, views, "O_DIRECT", lambda: odirect_round(peer, dst, w), args.reps
        )
    finally:
        conn.close()
        shutil.rmtree(work, ignore_errors=True)
    gib = n * size / 2**30
    print_rounds(times, gib, f"{n} objects of {size >> 10} KiB ({gib:.2f} GiB), {w} workers / threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
