# SPDX-License-Identifier: Apache-2.0
"""What the first write into each page of a card's mapping costs a process that just mapped it.

A prefilled tmpfs file (a card image written in full, as bench_connector's) is mapped MAP_SHARED by this
process; 2 MiB objects are copied into it from warm buffers: pass 1 touches each page of the mapping for
the first time (a minor fault per 4 KiB page, the tmpfs page itself exists), pass 2 the same pages again.
One thread, then with MADV_POPULATE_WRITE of each object's range first (what the card store does before
a store's copy), in a fresh mapping each."""
import mmap
import os
import sys
import time

import numpy as np

MIB = 1 << 20
path = sys.argv[1] if len(sys.argv) > 1 else "/dev/shm/adp-mapping-probe.img"
size = int(sys.argv[2]) * MIB if len(sys.argv) > 2 else 1024 * MIB
obj = 2 * MIB
with open(path, "wb") as f:  # written in full: no holes
    chunk = b"\0" * (64 * MIB)
    for _ in range(size // len(chunk)):
        f.write(chunk)
src = np.ones(64 * MIB, dtype=np.uint8)  # warm source, 32 objects reused
POPULATE_WRITE = 23


def run(populate: bool) -> list[float]:
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, size, mmap.MAP_SHARED)
    dst = np.frombuffer(m, dtype=np.uint8)
    out = []
    for _ in range(2):
        t = time.perf_counter()
        for i in range(size // obj):
            if populate:
                m.madvise(POPULATE_WRITE, i * obj, obj)
            s = (i % 32) * obj
            dst[i * obj : (i + 1) * obj] = src[s : s + obj]
        out.append(size / (time.perf_counter() - t) / 1e9)
    del dst
    m.close()
    os.close(fd)
    return out


for rnd in range(2):
    a, b = run(False), run(True)
    print(f"round {rnd}: plain copy  first pass {a[0]:.2f} GB/s, second pass {a[1]:.2f} GB/s ({a[1] / a[0]:.2f}x)")
    print(f"round {rnd}: populate+copy first pass {b[0]:.2f} GB/s, second pass {b[1]:.2f} GB/s ({b[1] / b[0]:.2f}x)")
os.unlink(path)
