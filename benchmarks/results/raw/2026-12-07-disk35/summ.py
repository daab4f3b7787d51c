"""Per-pass ratios of store_disk_rounds.cc's modes to mode T (a sync after every slice): the median over the passes
of each pass's whole-pass MiB/s ratio, with the flushes a pass. Usage: summ.py OUT..."""

import re
import statistics
import sys

for path in sys.argv[1:]:
    passes: dict[int, dict[str, tuple[float, float, int]]] = {}
    for line in open(path):
        m = re.match(r"pass (\d+) mode (\w): whole (\d+) MiB/s, median round (\S+) MiB/s, syncs (\d+)", line)
        if m:
            rnd = float(m[4]) if m[4] != "-" else 0.0
            passes.setdefault(int(m[1]), {})[m[2]] = (float(m[3]), rnd, int(m[5]))
    modes = sorted({k for p in passes.values() for k in p})
    print(f"{path}: {len(passes)} passes")
    for mode in modes:
        whole = [p[mode][0] / p["T"][0] for p in passes.values() if mode in p and "T" in p]
        rnd = [p[mode][1] / p["T"][1] for p in passes.values() if mode in p and "T" in p and p["T"][1]]
        syncs = statistics.median(p[mode][2] for p in passes.values() if mode in p)
        mib = statistics.median(p[mode][0] for p in passes.values() if mode in p)
        print(
            f"  {mode}: whole MiB/s median {mib:.0f}; / T per pass: whole median {statistics.median(whole):.3f} "
            f"(p25 {statistics.quantiles(whole)[0]:.3f}, p75 {statistics.quantiles(whole)[2]:.3f}), median round "
            f"{statistics.median(rnd):.3f}; flushes a pass (median) {syncs:.0f}"
        )
