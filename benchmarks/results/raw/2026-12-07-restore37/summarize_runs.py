#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One markdown row per bench_restore run of this session: its L2->L1 (LOOKUP: LMCache's prefetch) medians per
tier, the issue's ratio (card - mock) / (fs_native - mock), the load, and per tier from the sampled disk
counters (window_inflight.py's method): the mean read request size and the MiB in flight during its prefetches.

    python summarize_runs.py LABEL=RAWDIR:SAMPLES.tsv ...
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
print("| run | tree | start UTC | load start, end | mock | card | fs_native | card added / fs_native added | "
      "card: request MiB, MiB in flight | fs_native: request MiB, MiB in flight |")
print("|---|---|---|---|---:|---:|---:|---:|---|---|")
for arg in sys.argv[1:]:
    label, _, rest = arg.partition("=")
    raw, _, samples = rest.partition(":")
    d = json.loads((Path(raw) / "samples.json").read_text())
    med = {t: statistics.median(r["lookup_s"] for r in v["l2"]) for t, v in d["tiers"].items()}
    ratio = (med["adp"] - med["mock"]) / (med["fs_native"] - med["mock"])
    disk = {}
    if samples:
        out = subprocess.run([sys.executable, str(HERE / "window_inflight.py"), samples, raw], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            tier = line.split()[0]
            req = float(line.split(" requests of ")[1].split()[0])
            mib = float(line.split("(~")[1].split()[0])
            disk.setdefault(tier, []).append((req, mib))
    def cell(t):
        v = disk.get(t)
        if not v:
            return ""
        return f"{statistics.mean(x[0] for x in v):.2f}, {', '.join(f'{x[1]:.0f}' for x in v)}"
    ls, le = d["host"]["loadavg_start"][0], d["host"]["loadavg_end"][0]
    tree = "B" if label.startswith("B") else "A"
    print(f"| {label} | {tree} | {d['when'][11:16]} | {ls:.1f}, {le:.1f} | {med['mock']:.3f} | {med['adp']:.3f} | "
          f"{med['fs_native']:.3f} | {ratio:.2f}x | {cell('adp')} | {cell('fs_native')} |")
