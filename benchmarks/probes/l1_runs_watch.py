# SPDX-License-Identifier: Apache-2.0
"""Probe (issue 10 item 4, session 27): the physical contiguity of each `lmcache bench l2` process's L1 while
bench_l2.py runs (root only: another process's /proc/PID/pagemap).

Polls for processes whose command line holds "bench l2" and descends from --parent, finds the largest
anonymous read-write mapping (L1: 2 x 128 keys x OBJ bytes), and after --settle seconds of the process's life
(and at 2x, 3x) prints the physically contiguous runs per OBJ-sized object of it, one line per process,
with the process's --l2-adapter type and --output file (the row and pass of bench_l2.py).

Run beside bench_l2.py: python benchmarks/probes/l1_runs_watch.py --parent PID_OF_BENCH_L2 [--obj-kb 2048]
"""

import argparse
import json
import os
import struct
import time


def descends(pid: int, parent: int) -> bool:
    while pid > 1:
        if pid == parent:
            return True
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def runs_of(pid: int, obj: int) -> list[int] | None:
    best = None
    for line in open(f"/proc/{pid}/maps"):
        f = line.split()
        if len(f) == 5 and f[1].startswith("rw"):  # anonymous
            a, b = (int(x, 16) for x in f[0].split("-"))
            if not best or b - a > best[1] - best[0]:
                best = (a, b)
    if not best or best[1] - best[0] < 64 * obj:
        return None
    out = []
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        a = (best[0] + obj - 1) // obj * obj
        while a + obj <= best[1]:
            f.seek(a // 4096 * 8)
            pfns = [e & ((1 << 55) - 1) for e in struct.unpack(f"{obj // 4096}Q", f.read(obj // 4096 * 8))]
            if all(pfns):
                out.append(1 + sum(1 for x, y in zip(pfns, pfns[1:], strict=False) if y != x + 1))
            a += obj
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--obj-kb", type=int, default=2048)
    p.add_argument("--settle", type=float, default=4.0)
    a = p.parse_args()
    obj, seen = a.obj_kb * 1024, {}  # pid: samples taken
    while os.path.exists(f"/proc/{a.parent}"):
        for d in os.listdir("/proc"):
            if not d.isdigit() or seen.get(int(d), 0) >= 3:
                continue
            pid = int(d)
            try:
                argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                if b"bench" not in argv or b"l2" not in argv or not descends(pid, a.parent):
                    continue
                start = os.stat(f"/proc/{pid}").st_mtime
                if time.time() - start < a.settle * (seen.get(pid, 0) + 1):
                    continue
                runs = runs_of(pid, obj)
            except OSError:
                continue
            if runs is None:
                continue
            seen[pid] = seen.get(pid, 0) + 1
            args = [x.decode() for x in argv]
            kind = json.loads(args[args.index("--l2-adapter") + 1]).get("type", "?")
            out = args[args.index("--output") + 1] if "--output" in args else "?"
            runs.sort()
            n = len(runs)
            print(
                f"{time.strftime('%H:%M:%S')} pid {pid} {kind} {os.path.basename(out)}: {n} objects of L1, runs per "
                f"object median {runs[n // 2]}, p10 {runs[n // 10]}, p90 {runs[9 * n // 10]}, "
                f"over 254: {sum(r > 254 for r in runs)}",
                flush=True,
            )
        time.sleep(0.5)


if __name__ == "__main__":
    main()
