# SPDX-License-Identifier: Apache-2.0
"""Probe (issue 10 item 4, session 20): where an O_DIRECT read lands and what that costs on this VM.

T threads each `preadv` (O_DIRECT, one request per object) their share of OBJECTS objects of SIZE bytes from a
file on the disk, a round at a time, into one of these destinations:

  warm    a reused buffer per thread (mmap MAP_POPULATE, as the card's staging: AlignedBuffer)
  staged  warm, then a numpy copy into the object's slice of (torch-warm): the card's staged path, less the CRC
  fresh   the object's slice of a new anonymous mmap each round, never touched before the read
  torch   the object's slice of an L1 allocated as `lmcache bench l2` allocates it (torch.empty, aligned by
          slicing: data.py make_aligned_tensor), not touched before the first round; rounds reuse it
  torch-warm  the same, every byte written (fill_) once before the first round: what bench l2 does
  torch-small the same as torch-warm, but 8 objects' worth of L1 reused round-robin (a small footprint)
  huge    as warm, but the buffer 2 MiB aligned and madvise(MADV_HUGEPAGE) before it is touched (THP is
          "madvise" on this VM): physically contiguous in 2 MiB pieces
  staged-huge  huge, then the numpy copy into torch-warm

Per mode and round: MiB/s, the disk's read requests per object (/proc/diskstats), the destination's physically
contiguous runs per object (/proc/self/pagemap, root only: a request of more runs than the queue's max_segments
is split), and CPU seconds (user, system) of this process. Rounds alternate the modes (every other round in
reverse order). Needs no LMCache; torch for the torch modes.

Run (from the repository root): python benchmarks/probes/l1_dest.py --dir /var/tmp/x --size-kb 2048
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import resource
import statistics
import struct
import threading
import time
from pathlib import Path

import numpy as np
import torch

PAGE = 4096


def buffer_at(ptr: int, n: int) -> memoryview:
    return memoryview((ctypes.c_char * n).from_address(ptr)).cast("B")


def aligned_tensor(n: int) -> torch.Tensor:
    backing = torch.empty(n + PAGE - 1, dtype=torch.uint8)
    off = (-backing.data_ptr()) % PAGE
    t = backing[off : off + n]
    t._backing = backing  # keep it alive
    return t


def huge_buffer(n: int) -> memoryview:
    """n bytes of a 2 MiB aligned anonymous mapping advised MADV_HUGEPAGE, then touched."""
    huge = 2 << 20
    m = mmap.mmap(-1, n + 2 * huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    off = (-addr) % huge
    length = (n + huge - 1) // huge * huge
    m.madvise(mmap.MADV_HUGEPAGE, off, length)
    view = memoryview(m)[off : off + n]
    view[:] = b"\1" * n
    _keep.append(m)
    return view


_keep: list = []


def disk_reads(dev: str) -> int:
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == dev:
            return int(f[3])
    return 0


def phys_runs(ptr: int, n: int) -> int:
    """Physically contiguous runs in [ptr, ptr + n) (pages must be present); 0 if PFNs are hidden."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(ptr // PAGE * 8)
        raw = f.read(n // PAGE * 8)
    pfns = [e & ((1 << 55) - 1) for (e,) in struct.iter_unpack("<Q", raw)]
    if not any(pfns):
        return 0
    return 1 + sum(1 for a, b in zip(pfns, pfns[1:], strict=False) if b != a + 1)


class Probe:
    def __init__(self, path: Path, size: int, objects: int, threads: int, file_objects: int):
        self.size, self.objects, self.threads = size, objects, threads
        self.file_objects = file_objects
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        self.span = objects * size
        self.warm = [
            mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE) for _ in range(threads)
        ]
        self.huge = [huge_buffer(size) for _ in range(threads)]
        self.l1_cold = aligned_tensor(self.span)  # torch, untouched until round 1
        self.l1_warm = aligned_tensor(self.span)
        self.l1_warm.fill_(1)
        self.l1_small = aligned_tensor(8 * size)
        self.l1_small.fill_(1)
        self.round_no = 0

    def run(self, mode: str) -> dict:
        size, per = self.size, self.objects // self.threads
        first = (self.round_no * self.objects) % self.file_objects
        self.round_no += 1
        fresh = None
        if mode == "fresh":
            fresh = mmap.mmap(-1, self.span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            base = ctypes.addressof(ctypes.c_char.from_buffer(fresh))
        elif mode == "torch":
            base = self.l1_cold.data_ptr()
        elif mode in ("torch-warm", "staged", "staged-huge"):
            base = self.l1_warm.data_ptr()
        elif mode == "torch-small":
            base = self.l1_small.data_ptr()
        else:
            base = None
        l1_np = self.l1_warm.numpy()

        def dest(t: int, i: int) -> memoryview:
            if mode in ("warm", "staged"):
                return memoryview(self.warm[t])
            if mode in ("huge", "staged-huge"):
                return self.huge[t]
            slot = (t * per + i) % 8 if mode == "torch-small" else t * per + i
            return buffer_at(base + slot * size, size)

        def worker(t: int) -> None:
            for i in range(per):
                obj = first + t * per + i
                d = dest(t, i)
                if os.preadv(self.fd, [d], obj * size) != size:
                    raise RuntimeError("short read")
                if mode in ("staged", "staged-huge"):
                    slot = (t * per + i) * size
                    np.copyto(l1_np[slot : slot + size], np.frombuffer(d, dtype=np.uint8))

        r0, c0 = disk_reads(DEV), resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        ths = [threading.Thread(target=worker, args=(t,)) for t in range(self.threads)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        dt = time.perf_counter() - t0
        r1, c1 = disk_reads(DEV), resource.getrusage(resource.RUSAGE_SELF)
        if mode in ("warm", "staged"):
            runs = statistics.mean(phys_runs(ctypes.addressof(ctypes.c_char.from_buffer(b)), size) for b in self.warm)
        elif mode in ("huge", "staged-huge"):
            runs = statistics.mean(phys_runs(ctypes.addressof(ctypes.c_char.from_buffer(b)), size) for b in self.huge)
        else:
            runs = statistics.mean(
                phys_runs(base + (s % 8 if mode == "torch-small" else s) * size, size)
                for s in range(0, self.objects, max(1, self.objects // 16))
            )
        if fresh is not None:
            fresh.close()
        return {
            "mibps": self.span / dt / 2**20,
            "reqs": (r1 - r0) / self.objects,
            "runs": runs,
            "user": c1.ru_utime - c0.ru_utime,
            "sys": c1.ru_stime - c0.ru_stime,
        }


DEV = "vda"


def main() -> None:
    global DEV
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--size-kb", type=int, default=2048)
    p.add_argument("--objects", type=int, default=128, help="objects per round (bench l2: 4 x 32)")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--file-mb", type=int, default=1024)
    p.add_argument("--dev", default="vda")
    p.add_argument("--modes", default="warm,staged,huge,staged-huge,fresh,torch,torch-warm,torch-small")
    a = p.parse_args()
    DEV = a.dev
    size = a.size_kb * 1024
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "probe.img"
    if not path.exists() or path.stat().st_size < a.file_mb << 20:
        with open(path, "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(a.file_mb):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    probe = Probe(path, size, a.objects, a.threads, (a.file_mb << 20) // size)
    modes = a.modes.split(",")
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    print(f"size {a.size_kb} KiB, {a.objects} objects a round, {a.threads} threads, load {os.getloadavg()}")
    for r in range(a.rounds):
        for m in modes if r % 2 == 0 else modes[::-1]:
            res = probe.run(m)
            rows[m].append(res)
            print(
                f"round {r} {m:12s} {res['mibps']:8.0f} MiB/s  reqs/obj {res['reqs']:.2f}  runs/obj "
                f"{res['runs']:6.1f}  user {res['user']:.3f} sys {res['sys']:.3f}",
                flush=True,
            )
    print("summary (median over rounds; torch: round 0 is its first touch, shown apart)")
    for m in modes:
        rs = rows[m][1:] if m == "torch" else rows[m]
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        extra = f"  first round {rows[m][0]['mibps']:.0f} MiB/s" if m == "torch" else ""
        print(
            f"  {m:12s} {med['mibps']:8.0f} MiB/s  reqs/obj {med['reqs']:.2f}  runs/obj {med['runs']:6.1f}  "
            f"sys/round {med['sys']:.3f}{extra}"
        )
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
