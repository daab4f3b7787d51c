#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""hugel1: item 5 on disk from the runs' samples.json (runs/raw/*/samples.json), as item5v computed it: prefetch =
LMCache's L2->L1 time (the server's "Prefetch request completed ... in N ms"), added = tier - mock of the same
round; order A = the card's tier right after fs_native's, B = fs_native's right after the card's. Prints markdown."""

import bisect
import csv
import datetime
import gzip
import json
import re
import statistics
import sys
from pathlib import Path

LINE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\].*Prefetch request completed.*\(0 L1, (\d+) L2\) in ([\d.]+) ms")

here = Path(__file__).resolve().parent
disk_csv = here / "disk.csv.gz"
samples = []
if disk_csv.exists():
    with gzip.open(disk_csv, "rt") as f:
        samples = [(float(r["t"]), int(r["reads"]), int(r["rsect"])) for r in csv.DictReader(f)]
times = [s[0] for s in samples]


def disk_requests(log: Path) -> list[tuple[float, float]]:
    """Each L2 prefetch in a server log: (its ms, vda's mean read request KiB from the sample at or before its start
    to the one at or after its end; the samples are 0.1 s apart, so up to ~0.2 s of other reads may be in it)."""
    out = []
    gz = log.with_name(log.name + ".gz")  # raw files over 20 KB are kept gzipped
    text = gzip.open(gz, "rt", errors="replace").read() if gz.exists() else log.read_text(errors="replace")
    for m in LINE.finditer(text):
        end = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(
            tzinfo=datetime.timezone.utc).timestamp()  # fmt: skip
        ms = float(m.group(3))
        i, j = bisect.bisect_right(times, end - ms / 1000) - 1, bisect.bisect_left(times, end)
        if i < 0 or j >= len(samples):
            out.append((ms, float("nan")))
            continue
        reads, sect = samples[j][1] - samples[i][1], samples[j][2] - samples[i][2]
        out.append((ms, sect * 512 / 1024 / max(reads, 1)))
    return out


runs = []
for p in sorted((here / "runs" / "raw").glob("*/samples.json")):
    r = json.loads(p.read_text())
    if not {"mock", "adp", "fs_native"} <= set(r["tiers"]) or "loadavg_end" not in r["host"]:
        continue
    order = r["tier_orders"][0]
    kind = "A" if order.index("adp") == order.index("fs_native") + 1 else (
        "B" if order.index("fs_native") == order.index("adp") + 1 else "?")
    pf = {t: [s["prefetch"]["ms"] for s in r["tiers"][t]["l2"]] for t in ("mock", "adp", "fs_native")}
    checks = [rd.get("l1_check", "") for t in r["tiers"].values() for rd in t["rounds"]]
    fio = {(f["when"], f["jobs"], f.get("iomem", "malloc")): f["bw_bytes"] for f in r["fio"]}
    req = {t: disk_requests(p.parent / f"{t}.log") for t in ("adp", "fs_native")}
    runs.append({"run": p.parent.name, "order": order, "kind": kind, "pf": pf,
                 "load": (r["host"]["loadavg_start"][0], r["host"]["loadavg_end"][0]),
                 "huge": sum(c.startswith("L1 on 2 MiB hugetlb pages") for c in checks), "servers": len(checks),
                 "fio": fio, "req": req})  # fmt: skip

med = statistics.median


def ratio(pf: dict) -> float:
    m = med(pf["mock"])
    return (med(pf["adp"]) - m) / (med(pf["fs_native"]) - m)


print("| run | order | load start -> end | L1s on hugetlb (smaps) | fio 4 jobs hugetlb / 4 KiB GiB/s (before, after) "
      "| mock ms | card ms | fs_native ms | card added / fs_native added | card / fs_native prefetch, restore by restore "
      "| vda read request KiB, card; fs_native |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for x in runs:
    f = x["fio"]
    fio = ", ".join(f"{f[(w, 4, 'mmaphuge')] / 2**30:.2f} / {f[(w, 4, 'malloc')] / 2**30:.2f}" for w in ("before", "after"))
    pairs = " ".join(f"{a / b:.2f}" for a, b in zip(x["pf"]["adp"], x["pf"]["fs_native"]))
    print(f"| {x['run']} | {x['kind']}: {', '.join(x['order'])} | {x['load'][0]:.1f} -> {x['load'][1]:.1f} | "
          f"{x['huge']} of {x['servers']} | {fio} | {med(x['pf']['mock']):.0f} | {med(x['pf']['adp']):.0f} | "
          f"{med(x['pf']['fs_native']):.0f} | {ratio(x['pf']):.2f}x | {pairs} | "
          f"{' '.join(f'{k:.0f}' for _, k in x['req']['adp'])}; {' '.join(f'{k:.0f}' for _, k in x['req']['fs_native'])} |")  # fmt: skip
print()
for kind in ("A", "B", "both"):
    sel = [x for x in runs if kind == "both" or x["kind"] == kind]
    if not sel:
        continue
    pooled = {t: [v for x in sel for v in x["pf"][t]] for t in ("mock", "adp", "fs_native")}
    rs = sorted(ratio(x["pf"]) for x in sel)
    below = sum(r < 1 for r in rs)
    print(f"- {kind}: {len(sel)} rounds; medians of all restores: mock {med(pooled['mock']):.0f}, card "
          f"{med(pooled['adp']):.0f}, fs_native {med(pooled['fs_native']):.0f} ms: card added / fs_native added "
          f"**{ratio(pooled):.2f}x**; rounds' ratios {', '.join(f'{r:.2f}' for r in rs)} (median {med(rs):.2f}x, "
          f"range {rs[0]:.2f}-{rs[-1]:.2f}x); card below fs_native in {below} of {len(rs)} rounds; card prefetch "
          f"{min(pooled['adp']):.0f}-{max(pooled['adp']):.0f} ms, fs_native {min(pooled['fs_native']):.0f}-"
          f"{max(pooled['fs_native']):.0f} ms, mock {min(pooled['mock']):.0f}-{max(pooled['mock']):.0f} ms")
# Does the tier's place in the run matter (with the L1 the same for all, item5v's carry-over should be gone)?
print()
print("| tier | prefetch ms at position 1 | at 2 | at 3 |")
print("|---|---|---|---|")
for t in ("mock", "adp", "fs_native"):
    cells = []
    for pos in (1, 2, 3):
        v = [ms for x in runs if x["order"].index(t) == pos - 1 for ms in x["pf"][t]]
        cells.append(f"{med(v):.0f} ({len(v)} restores)" if v else "-")
    print(f"| {t} | " + " | ".join(cells) + " |")
print()
# The plain ratio of prefetches (no mock subtracted: mock's own spread, 73-201 ms, does not enter it).
for kind in ("A", "B", "both"):
    sel = [x for x in runs if kind == "both" or x["kind"] == kind]
    if sel:
        a_ = [v for x in sel for v in x["pf"]["adp"]]
        f_ = [v for x in sel for v in x["pf"]["fs_native"]]
        per = sorted(med(x["pf"]["adp"]) / med(x["pf"]["fs_native"]) for x in sel)
        print(f"- {kind}: card / fs_native prefetch, medians of all restores {med(a_):.0f} / {med(f_):.0f} ms = "
              f"{med(a_) / med(f_):.2f}x; rounds {per[0]:.2f}-{per[-1]:.2f}x (median {med(per):.2f}x), card faster "
              f"in {sum(p < 1 for p in per)} of {len(per)}")
print()
# How firm the pooled ratio is: rounds resampled with replacement (seeded), the pooled ratio of each resample.
import random

rng = random.Random(40)
for kind in ("A", "B", "both"):
    sel = [x for x in runs if kind == "both" or x["kind"] == kind]
    if len(sel) < 3:
        continue
    boots = []
    for _ in range(4000):
        pick = [rng.choice(sel) for _ in sel]
        boots.append(ratio({t: [v for x in pick for v in x["pf"][t]] for t in ("mock", "adp", "fs_native")}))
    boots.sort()
    lo, hi = boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]
    print(f"- {kind}: pooled ratio, 95 % bootstrap interval over rounds (4000 resamples): {lo:.2f}-{hi:.2f}x")
if len(sys.argv) > 1:
    json.dump(runs, open(sys.argv[1], "w"), indent=1, default=str)
