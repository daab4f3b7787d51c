#!/usr/bin/env python3
"""item5v: the physical layout of each running LMCache server's L1, every 10 s until killed (one JSON line a
server and sample). The L1 is the server's largest anonymous mapping (--l1-size-gb); its page size from smaps
(LMCache 0.5.6 without CUDA falls back from --l1-use-hugepages to ordinary pages: 4 KiB). From
/proc/PID/pagemap (root): pages present, how many 4 KiB pages lie physically right after their virtual
predecessor, the mean physically contiguous run (KiB), and per 32 MiB of L1 the runs it is made of (a disk
request holds at most 254 of them: /sys/block/vda/queue/max_segments, and at most 4 MiB)."""
import array
import json
import re
import subprocess
import sys
import time

out = open(sys.argv[1], "w", buffering=1)
PFN = (1 << 55) - 1


def servers() -> list[tuple[int, str]]:
    r = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True)
    got = []
    for line in r.stdout.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "lmcache server" in args and "--l2-adapter" in args:
            m = re.search(r'--l2-adapter \{"type": "(\w+)"', args)
            got.append((int(pid), m.group(1) if m else "?"))
    return got


def l1_layout(pid: int) -> dict:
    maps, cur = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ (\d+)", line)
            if m:
                cur = {"lo": int(m.group(1), 16), "hi": int(m.group(2), 16), "anon": m.group(4) == "0"}
                maps.append(cur)
            elif cur is not None and line.startswith(("KernelPageSize:", "Rss:", "Private_Hugetlb:")):
                k, _, v = line.partition(":")
                cur[k] = int(v.split()[0])
    l1 = max((m for m in maps if m["anon"]), key=lambda m: m["hi"] - m["lo"])
    n = (l1["hi"] - l1["lo"]) // 4096
    a = array.array("Q")
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        pm.seek(l1["lo"] // 4096 * 8)
        a.frombytes(pm.read(n * 8))
    pfn = [e & PFN if e >> 63 else 0 for e in a]
    present = sum(1 for p in pfn if p)
    adj = sum(1 for x, y in zip(pfn, pfn[1:]) if x and y == x + 1)
    per32 = []  # physically contiguous runs in each 32 MiB of L1
    step = 8192
    for s in range(0, n - step + 1, step):
        seg = pfn[s:s + step]
        per32.append(1 + sum(1 for x, y in zip(seg, seg[1:]) if y != x + 1))
    per32.sort()
    return {"mib": (l1["hi"] - l1["lo"]) >> 20, "page_kib": l1.get("KernelPageSize"), "rss_mib": l1.get("Rss", 0) >> 10,
            "hugetlb_kib": l1.get("Private_Hugetlb"), "present": present, "adjacent": adj,
            "mean_run_kib": 4 * present / max(present - adj, 1),
            "runs_per_32mib_median": per32[len(per32) // 2] if per32 else None,
            "runs_per_32mib_min_max": [per32[0], per32[-1]] if per32 else None}


while True:
    for pid, kind in servers():
        try:
            out.write(json.dumps({"t": round(time.time(), 3), "pid": pid, "l2": kind, "l1": l1_layout(pid)}) + "\n")
        except (OSError, ValueError):
            pass
    time.sleep(10)
