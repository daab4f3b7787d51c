#!/usr/bin/env python3
"""item5v: does the physical layout of the destination memory set the disk's request size and the read time?

Reads one 1 GiB file (written with O_DIRECT and synced: 32 objects of 32 MiB) as both plugins read a prefetch
batch: 4 threads, each 8 consecutive objects, one O_DIRECT preadv of 32 MiB an object, into a 1 GiB buffer that
is (a) ordinary anonymous memory, 4 KiB pages, mapped and touched anew each trial (what LMCache 0.5.6 gives its
L1 on a CPU-only host, --l1-use-hugepages or not), or (b) MAP_HUGETLB 2 MiB pages (the pool grown by 512 pages
for the probe, given back after). a b b a, `cycles` times. Per trial: seconds, vda's mean read request (KiB),
and the buffer's physically contiguous runs (/proc/self/pagemap). python probe_l1.py WORKDIR OUT.json [cycles]"""
import array
import json
import mmap
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from vda import vda  # beside this script

MiB, OBJ, N = 1 << 20, 32 << 20, 32
MAP_HUGETLB = 0x40000
work, out = Path(sys.argv[1]), Path(sys.argv[2])
cycles = int(sys.argv[3]) if len(sys.argv) > 3 else 3
work.mkdir(parents=True, exist_ok=True)
HP = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")


def runs(buf: mmap.mmap) -> int:
    import ctypes

    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    a = array.array("Q")
    with open("/proc/self/pagemap", "rb") as pm:
        pm.seek(addr // 4096 * 8)
        a.frombytes(pm.read(len(buf) // 4096 * 8))
    pfn = [e & ((1 << 55) - 1) for e in a]
    return 1 + sum(1 for x, y in zip(pfn, pfn[1:]) if y != x + 1)


def trial(kind: str, path: Path) -> dict:
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (MAP_HUGETLB if kind == "hugetlb" else 0)
    buf = mmap.mmap(-1, N * OBJ, flags=flags)
    for off in range(0, N * OBJ, 4096):  # touched: every page present before the reads, as LMCache's L1
        buf[off] = 1
    nruns = runs(buf)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    mv = memoryview(buf)

    def worker(k: int) -> None:
        for i in range(k * 8, k * 8 + 8):
            os.preadv(fd, [mv[i * OBJ:(i + 1) * OBJ]], i * OBJ)

    before, t0 = vda(), time.monotonic()
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt, after = time.monotonic() - t0, vda()
    os.close(fd)
    mv.release()
    buf.close()
    reads, sect, ms = after[0] - before[0], after[2] - before[2], after[3] - before[3]
    return {"kind": kind, "s": dt, "gib_s": 1 / dt, "read_req_kib": sect * 512 / 1024 / max(reads, 1),
            "read_lat_ms": ms / max(reads, 1), "phys_runs": nruns, "mean_run_kib": N * OBJ / 1024 / nruns,
            "load": os.getloadavg()[0]}


path = work / "obj.dat"
subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=32M", "count=32", "iflag=fullblock", "oflag=direct",
                "conv=fsync", "status=none"], check=True)
before = int(HP.read_text())
rows = []
try:
    HP.write_text(str(before + 512))
    for _ in range(cycles):
        for kind in ("4k", "hugetlb", "hugetlb", "4k"):
            rows.append(trial(kind, path))
            print(rows[-1], flush=True)
finally:
    HP.write_text(str(before))
    out.write_text(json.dumps(rows, indent=1))
    subprocess.run(["rm", "-rf", str(work)])
    os.sync()
    time.sleep(5)
