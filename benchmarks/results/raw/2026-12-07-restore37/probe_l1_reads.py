#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Why a card's 32 MiB load makes smaller disk requests than fs_native's: the plugin, the image's layout on
disk, or the destination memory? Outside LMCache: 32 objects of 32 MiB stored once in a fresh sparse card image
(ADPConnector, 4 workers, as bench_restore's adp tier) and once with LMCache's own fs_native client
(LMCacheFSClient, 4 workers, O_DIRECT); then loaded as one batch of 32 keys (as LMCache's prefetch) into
destination buffers of two kinds, in turn: 4k (anonymous memory, MADV_NOHUGEPAGE: 4 KiB pages, physically
scattered) and thp (anonymous memory, MADV_HUGEPAGE: 2 MiB pages where the kernel has them). Per load: seconds,
GiB/s, and the disk's requests (/proc/diskstats: completed reads, their mean size, mean reads in flight).
Every loaded byte is compared. `filefrag` of the image and of fs_native's files at the end.

    python probe_l1_reads.py /var/tmp/r37-probe [--rounds 3]
"""

import argparse
import ctypes
import mmap
import os
import select
import shutil
import subprocess
import sys
import time

import numpy as np

from lmcache.lmcache_fs import LMCacheFSClient
from lmcache_adp import ADPConnector

MiB = 1 << 20
SIZE, N = 32 * MiB, 32
libc = ctypes.CDLL("libc.so.6", use_errno=True)
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15


def buffers(kind: str) -> tuple[mmap.mmap, list[memoryview]]:
    m = mmap.mmap(-1, SIZE * N + (2 * MiB))
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    off = (-base) % (2 * MiB)  # 2 MiB aligned start: each object starts on a huge page
    addr = base + off
    adv = MADV_HUGEPAGE if kind == "thp" else MADV_NOHUGEPAGE
    if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(SIZE * N), adv) != 0:
        raise OSError(ctypes.get_errno(), "madvise")
    np.frombuffer(m, dtype=np.uint8).fill(1)
    mv = memoryview(m)
    return m, [mv[off + i * SIZE : off + (i + 1) * SIZE] for i in range(N)]


def disk() -> tuple[int, int, int]:
    for line in open("/proc/diskstats"):
        f = line.split()
        if f[2] == "vda":
            return int(f[3]), int(f[5]), int(f[6])
    raise RuntimeError("no vda")


def wait(c, n: int) -> list:
    got = []
    while len(got) < n:
        select.select([c.event_fd()], [], [], 5)
        got += c.drain_completions()
    return got


def anon_huge_kb() -> int:
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(f"{a.work}/fs_native")
    rng = np.random.default_rng(7)
    src_map, src = buffers("4k")
    for i, b in enumerate(src):
        x = np.frombuffer(b, dtype=np.uint8)
        x[:] = rng.integers(0, 256, SIZE, dtype=np.uint8) if i == 0 else np.roll(np.frombuffer(src[0], np.uint8), i)
    keys = [f"probe@1@0@{i:08x}" for i in range(N)]
    card = ADPConnector(card=f"{a.work}/card.img", card_size_gb=8, num_workers=4, timeout_ms=60000)
    fsn = LMCacheFSClient(f"{a.work}/fs_native", 4, "", True, 0)
    for name, c in (("adp", card), ("fs_native", fsn)):
        c.submit_batch_set(keys, src)
        ((_, ok, *_),) = wait(c, 1)
        print(f"stored {name}: ok={ok}", flush=True)
    os.sync()
    dsts = {k: buffers(k) for k in ("4k", "thp")}
    print(f"AnonHugePages of this process: {anon_huge_kb() / 1024:.0f} MiB (the thp buffers: {N * SIZE / MiB:.0f} MiB)")
    for r in range(a.rounds):
        order = [("adp", "4k"), ("fs_native", "4k"), ("adp", "thp"), ("fs_native", "thp")]
        if r % 2:
            order.reverse()
        for name, kind in order:
            c = card if name == "adp" else fsn
            _, dst = dsts[kind]
            for b in dst:
                np.frombuffer(b, dtype=np.uint8)[:] = 0
            r0, s0, m0 = disk()
            t0 = time.perf_counter()
            c.submit_batch_get(keys, dst)
            got = wait(c, 1)
            dt = time.perf_counter() - t0
            r1, s1, m1 = disk()
            bad = sum(bytes(d) != bytes(s) for d, s in zip(dst, src, strict=True))
            reqs, sect = r1 - r0, s1 - s0
            print(
                f"round {r + 1} {name:<9} into {kind:<3}: {dt:.3f} s, {N * SIZE / 2**30 / dt:.2f} GiB/s; disk "
                f"{sect * 512 / 2**30:.2f} GiB in {reqs} requests of {sect * 512 / max(reqs, 1) / MiB:.2f} MiB, "
                f"{(m1 - m0) / 1e3 / dt:.1f} reads in flight; mismatched {bad}; completion {got[0][1]}",
                flush=True,
            )
    card.close()
    fsn.close()
    for what, paths in (("card image", [f"{a.work}/card.img"]),
                        ("fs_native files", sorted(str(p) for p in os.scandir(f"{a.work}/fs_native")))):
        paths = [p if isinstance(p, str) else p.path for p in paths]
        files = []
        for root, _, fs in os.walk(f"{a.work}/fs_native"):
            files += [os.path.join(root, f) for f in fs]
        if what != "card image":
            paths = files
        out = subprocess.run(["filefrag", *paths], capture_output=True, text=True).stdout
        total = sum(int(line.rsplit(":", 1)[1].split()[0]) for line in out.splitlines() if "extent" in line)
        print(f"filefrag {what}: {len(paths)} files, {total} extents in all")
    shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
