#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Session 36 (brief sync36): bench_connector's ABBA rounds (raw/<stamp>-s36-ab-<step>/rows.json) and
probe_store_sync's (probe-<step>-w<T>.json) side by side: store GB/s (median of the repetitions), the embedded row
over the medium's better O_DIRECT write pass, and the connector's store runs (worker_put_slices / worker_put_runs:
slices a sync, worker_put_runs a pass, worker_put_late_slices).

    python summ36.py DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

d = Path(sys.argv[1])
KPW = 2  # bench_connector's --keys-per-worker (its default)
print("## bench_connector")
print("| step | object | workers | medium write GB/s | embedded store GB/s | store / medium | slices | runs | slices a run | late slices | runs a pass |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for f in sorted(d.glob("raw/*-s36-ab-*/rows.json")):
    step = f.parent.name.rsplit("-", 1)[1]
    rows = json.loads(f.read_text())["rows"]
    for r in rows:
        if r["row"] != "embedded":
            continue
        key = (r["object_mb"], r["workers"])
        med = [m for m in rows if m["row"] == "medium O_DIRECT" and (m["object_mb"], m["workers"]) == key]
        gbs = lambda s: r["bytes"] / statistics.median(s) / 1e9  # noqa: E731
        mw = max(m["bytes"] / statistics.median(m["store_s"]) / 1e9 for m in med)
        ew = gbs(r["store_s"])
        st = r.get("stats", {})
        sl, runs, late = st.get("worker_put_slices", 0), st.get("worker_put_runs", 0), st.get("worker_put_late_slices", 0)
        w = r["workers"]
        passes = sl / (-(-r["objects"] // (w * KPW)) * w)  # store passes the counters saw (slices / a pass's)
        print(
            f"| {step} | {r['object_mb']:g} MiB | {r['workers']} | {mw:.2f} | {ew:.2f} | {ew / mw:.2f} | {sl} | {runs} | "
            f"{sl / runs if runs else float('nan'):.2f} | {late} | {runs / passes:.0f} |"
        )
print()
print("## probe_store_sync (one rep of 256 MiB; ratio to the medium's end-sync row)")
for f in sorted(d.glob("probe-*-w*.log")):
    head = None
    for line in f.read_text().splitlines():
        if line.startswith("== "):
            head = line[3:].split(",")[0]
        elif line.startswith("| embedded") or line.startswith("| medium, sync per slice"):
            c = [x.strip() for x in line.strip("|").split("|")]
            print(f"- {f.stem} {head}: {c[0]} {c[1]} GB/s {c[2]}")
