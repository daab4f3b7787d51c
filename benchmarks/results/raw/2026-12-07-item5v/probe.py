#!/usr/bin/env python3
"""item5v: does what a tier leaves on this disk slow the reads right after it, without LMCache?

Reads one 1 GiB file (fio as bench_restore's limit: O_DIRECT, psync, 32 MiB blocks, 4 jobs each its quarter,
one pass) right after each of: nothing; writing 1 GiB as 32 new 32 MiB files with O_DIRECT and no sync (what
fs_native's store leaves); the same then `sync` (timed); deleting 1 GiB of such files (written and synced at the
start) then `sync` (timed: with the `discard` mount option the commit sends the discards). Conditions in
ABCD DCBA order, `--cycles` times; vda's counters over each read. python probe.py WORKDIR OUT.json"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from vda import vda  # beside this script

MiB = 1 << 20
work, out = Path(sys.argv[1]), Path(sys.argv[2])
cycles = int(sys.argv[3]) if len(sys.argv) > 3 else 2
work.mkdir(parents=True, exist_ok=True)


def write_files(d: Path, n: int = 32) -> None:
    d.mkdir(parents=True)
    buf = os.urandom(MiB) * 32
    import mmap

    m = mmap.mmap(-1, 32 * MiB)  # page-aligned for O_DIRECT
    m.write(buf)
    for i in range(n):
        fd = os.open(d / f"obj{i}.tmp", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        os.write(fd, m)
        os.close(fd)
        os.rename(d / f"obj{i}.tmp", d / f"obj{i}")


def fio(path: Path) -> float:
    share = (1 << 30) // 4
    r = subprocess.run(["fio", "--name=probe", f"--filename={path}", "--rw=read", "--direct=1", "--ioengine=psync",
                        "--bs=32M", "--numjobs=4", f"--size={share}", f"--offset_increment={share}",
                        "--group_reporting", "--output-format=json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["jobs"][0]["read"]["bw_bytes"] / (1 << 30)


y = work / "y.dat"
subprocess.run(["dd", "if=/dev/urandom", f"of={y}", "bs=32M", "count=32", "iflag=fullblock", "oflag=direct",
                "conv=fsync", "status=none"], check=True)
seq = ["none", "write", "write+sync", "delete+sync"]
order = [c for _ in range(cycles) for c in seq + seq[::-1]]
dels = []
for i in range(order.count("delete+sync")):
    write_files(work / f"del{i}")
    dels.append(work / f"del{i}")
os.sync()
time.sleep(5)
rows = []
nw = 0
for c in order:
    t0 = time.monotonic()
    sync_s = None
    if c.startswith("write"):
        write_files(work / f"w{nw}")
        nw += 1
    if c == "delete+sync":
        subprocess.run(["rm", "-rf", str(dels.pop())], check=True)
    if c.endswith("sync"):
        s0 = time.monotonic()
        os.sync()
        sync_s = time.monotonic() - s0
    before, t1 = vda(), time.monotonic()
    gibs = fio(y)
    after = vda()
    d = [a - b for a, b in zip(after, before)]
    rows.append({"cond": c, "action_s": t1 - t0, "sync_s": sync_s, "read_gib_s": gibs,
                 "write_mib": d[6] * 512 / MiB, "discard_mib": d[13] * 512 / MiB, "flushes": d[15],
                 "read_req_kib": d[2] * 512 / 1024 / max(d[0], 1), "read_lat_ms": d[3] / max(d[0], 1),
                 "load": os.getloadavg()[0]})
    print(rows[-1], flush=True)
    time.sleep(3)
out.write_text(json.dumps(rows, indent=1))
subprocess.run(["rm", "-rf", str(work)])
os.sync()  # the removed files' discards sent now, not during the next holder's run
time.sleep(10)
