#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Probe (issue 10, load36): does the shape of a 256 KiB object's read cost on the medium itself? The card reads
an object as one O_DIRECT preadv of 260 KiB (its header block and payload) at a 4 KiB-aligned offset (objects one
after another, 260 KiB apart), into a huge-page staging buffer; bench_connector's medium row reads 256 KiB at
256 KiB-aligned offsets into 4 KiB-page buffers. Two threads read 1024 objects each way, three times:

  256K/256K huge   256 KiB at 256 KiB stride, into a buffer advised MADV_HUGEPAGE
  260K/260K huge   260 KiB at 260 KiB stride (the card's shape), the same buffer
  256K/256K 4k     the medium row's shape and buffer pages
  260K/260K 4k

GB/s counts 256 KiB an object (the payload), so a row that reads more for it shows it. On session 36's 2-core VM
all four were within its noise (0.78-1.09 GB/s); the 16-core host's disk (loads 0.69-0.76x of the medium in
session 35) is where it may tell.

  python benchmarks/probes/read_shape.py /var/tmp/shape/img
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time

N, T, K = 1024, 2, 1024


def buffers(huge: bool) -> list[mmap.mmap]:
    out = []
    for _ in range(T):
        m = mmap.mmap(-1, 4 << 20)
        if huge:
            m.madvise(mmap.MADV_HUGEPAGE)
        m.write(b"\1" * len(m))
        out.append(m)
    return out


def run(path: str, obj: int, stride: int, huge: bool) -> float:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    bufs = buffers(huge)

    def work(t: int) -> None:
        v = memoryview(bufs[t])[:obj]
        for j in range(t, N, T):
            os.preadv(fd, [v], j * stride)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(T)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    return N * 256 * K / dt / 1e9


def main(path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    chunk = b"\2" * (64 << 20)
    for _ in range(5):  # 320 MiB: 1024 objects of 260 KiB and more
        os.write(fd, chunk)
    os.fsync(fd)
    os.close(fd)
    try:
        shapes = [(256 * K, 256 * K, True), (260 * K, 260 * K, True), (256 * K, 256 * K, False), (260 * K, 260 * K, False)]  # fmt: skip
        for _ in range(3):
            print({f"{o // K}K/{s // K}K {'huge' if h else '4k'}": round(run(path, o, s, h), 2) for o, s, h in shapes})
    finally:
        os.unlink(path)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    main(sys.argv[1])
