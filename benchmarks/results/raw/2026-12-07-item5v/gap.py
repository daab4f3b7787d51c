#!/usr/bin/env python3
"""item5v: in each A round, seconds from the end of fs_native's tier to the card's first L2 prefetch. python gap.py RUN..."""
import sys, json, glob, re, statistics as st
sys.path.insert(0, '.')
import analyze as a
from pathlib import Path
gaps = []
for tag in sys.argv[1:]:
    d = Path(tag)
    wins = a.tier_windows(d / "bench.out")
    raws = sorted(glob.glob(f"runs/raw/*-{tag}")) + sorted(glob.glob(f"runs/raw/*-{tag}-FAILED"))
    res = json.loads(a.read_text(Path(raws[-1]) / "samples.json"))
    times = a.log_times(Path(raws[-1]))
    for rnd, order in enumerate(res["tier_orders"]):
        ia, fi = order.index("adp"), order.index("fs_native")
        if ia == fi + 1 and ("fs_native", rnd + 1) in wins:
            n = len(res["tiers"]["adp"]["l2"]) // len(res["tiers"]["adp"]["rounds"])
            first = res["tiers"]["adp"]["l2"][rnd * n]["request_id"]
            gaps.append(times[first][0] - wins[("fs_native", rnd + 1)][1])
print("card's first L2 prefetch after fs_native's tier ended (s):", [round(g) for g in gaps])
