#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""hugel1 item 3: the disk's limit for the item-5 prefetch, fio's O_DIRECT reads of 32 MiB blocks, 4 jobs (the
prefetch keeps 4 reads in flight), over a 1 GiB file (the prompt), into 4 KiB-page buffers (fio's malloc) and
2 MiB hugetlb buffers (--iomem=mmaphuge), alternating ABBA; vda's read requests counted around each run
(/proc/diskstats). Run as root under `flock /work/bench.lock`; grows the 2 MiB pool by 80 pages for the run and
gives them back. Usage: fio_limit.py WORKDIR OUTDIR PAIRS"""

import json
import subprocess
import sys
import time
from pathlib import Path

work, outdir, pairs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
POOL = Path("/proc/sys/vm/nr_hugepages")
MiB = 1 << 20


def vda() -> tuple[int, int]:
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == "vda":
            return int(f[3]), int(f[5])  # reads completed, sectors read
    raise SystemExit("no vda")


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


work.mkdir(parents=True, exist_ok=True)
outdir.mkdir(parents=True, exist_ok=True)
f = work / "fio.dat"
subprocess.run(["dd", "if=/dev/urandom", f"of={f}", "bs=32M", "count=32", "iflag=fullblock", "oflag=direct",
                "conv=fsync", "status=none"], check=True)  # fmt: skip
before = int(POOL.read_text())
POOL.write_text(str(before + 80))
rows = []
try:
    order = []
    for i in range(pairs):
        order += ["malloc", "mmaphuge"] if i % 2 == 0 else ["mmaphuge", "malloc"]
    for n, mem in enumerate(order, 1):
        out = outdir / f"fio-{n:02d}-{mem}.json"
        cmd = ["fio", "--name=limit", f"--filename={f}", "--rw=read", "--direct=1", "--ioengine=psync",
               "--bs=32M", "--numjobs=4", "--size=256M", "--offset_increment=256M", "--group_reporting",
               "--loops=3", "--output-format=json", f"--output={out}"]  # fmt: skip
        if mem == "mmaphuge":
            cmd.append("--iomem=mmaphuge")
        l0, (r0, s0) = load(), vda()
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        r1, s1 = vda()
        job = json.loads(out.read_text())["jobs"][0]["read"]
        reqs = r1 - r0
        rows.append({"n": n, "iomem": mem, "bw_bytes": job["bw_bytes"], "wall_s": wall, "load": l0,
                     "requests": reqs, "request_kib": (s1 - s0) * 512 / 1024 / max(reqs, 1),
                     "lat_mean_ms": job["clat_ns"]["mean"] / 1e6, "cmd": " ".join(cmd)})  # fmt: skip
        r = rows[-1]
        print(f"{n:2d} {mem:8s} {r['bw_bytes'] / (1 << 30):.2f} GiB/s  1 GiB in {(1 << 30) / r['bw_bytes']:.3f} s  "
              f"request {r['request_kib']:.0f} KiB  lat {r['lat_mean_ms']:.0f} ms  load {l0:.2f}", flush=True)  # fmt: skip
finally:
    POOL.write_text(str(before))
    f.unlink(missing_ok=True)
(outdir / "fio_limit.json").write_text(json.dumps(rows, indent=1))
