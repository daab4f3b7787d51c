#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""hugel1: why the card's prefetch trails fs_native's with hugetlb L1s (vda's requests: card ~3640 KiB, fs_native
4096 KiB). One 1 GiB batch read as both plugins read it (4 threads x 8 objects, one O_DIRECT read an object, each
thread's own 32 MiB MAP_HUGETLB destination), the objects laid out and read three ways:
  fs_native  object i at i x 32 MiB, pread of 32 MiB                          (8 requests of 4 MiB)
  card       object i at i x (32 MiB + 4 KiB), preadv [4 KiB header into an ordinary page, 32 MiB payload]
             = 32772 KiB in one read, as the card reads header and payload   (8 x 4 MiB + one of 4 KiB?)
  payload    as card, the payload alone (pread of 32 MiB at +4 KiB)           (the offset without the header)
vda's read requests counted around each trial. Root, under `flock /work/bench.lock`; grows the 2 MiB pool by 70
pages and gives them back. Usage: probe_split.py WORKDIR OUT.json ROUNDS"""

import json
import mmap
import os
import sys
import threading
import time
from pathlib import Path

work, out, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
MiB, KiB = 1 << 20, 1 << 10
OBJ, HDR, N, THREADS = 32 * MiB, 4 * KiB, 32, 4
POOL = Path("/proc/sys/vm/nr_hugepages")


def vda():
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == "vda":
            return int(f[3]), int(f[5])


def trial(fd, mode, bufs, hdrs):
    def worker(t):
        for i in range(t * (N // THREADS), (t + 1) * (N // THREADS)):
            if mode == "fs_native":
                n = os.preadv(fd, [bufs[t]], i * OBJ)
                assert n == OBJ, n
            elif mode == "card":
                n = os.preadv(fd, [hdrs[t], bufs[t]], i * (OBJ + HDR))
                assert n == OBJ + HDR, n
            else:
                n = os.preadv(fd, [bufs[t]], i * (OBJ + HDR) + HDR)
                assert n == OBJ, n

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    (r0, s0), l0, t0 = vda(), os.getloadavg()[0], time.monotonic()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    wall = time.monotonic() - t0
    r1, s1 = vda()
    return {"mode": mode, "s": wall, "requests": r1 - r0, "request_kib": (s1 - s0) * 512 / KiB / max(r1 - r0, 1),
            "load": l0}  # fmt: skip


work.mkdir(parents=True, exist_ok=True)
path = work / "objects.dat"
size = N * (OBJ + HDR) + MiB
with open(path, "wb") as f:
    for _ in range(size // MiB):
        f.write(os.urandom(MiB))
    f.flush()
    os.fsync(f.fileno())
before = int(POOL.read_text())
POOL.write_text(str(before + 70))
rows = []
try:
    bufs = [mmap.mmap(-1, OBJ, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000) for _ in range(THREADS)]
    hdrs = [mmap.mmap(-1, HDR) for _ in range(THREADS)]
    for b in bufs + hdrs:
        b.write(b"\0" * len(b))
        b.seek(0)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    order = ["fs_native", "card", "payload"]
    for r in range(rounds):
        for mode in order if r % 2 == 0 else order[::-1]:
            rows.append(trial(fd, mode, bufs, hdrs))
            x = rows[-1]
            print(f"{len(rows):2d} {mode:9s} {x['s']:.3f} s  {x['requests']} requests of {x['request_kib']:.0f} KiB  "
                  f"load {x['load']:.2f}", flush=True)  # fmt: skip
    os.close(fd)
    del bufs
finally:
    POOL.write_text(str(before))
    path.unlink(missing_ok=True)
out.write_text(json.dumps(rows, indent=1))
