# SPDX-License-Identifier: Apache-2.0
"""Summary of run.sh's output directory: per invocation and size, the embedded rows' GB/s (median rep) and
their ratios to the same invocation's medium end-sync row, durable=false row and fio peers (run just before
it); then per build, the median of those ratios and of all reps' GB/s.  usage: summ.py OUTDIR"""
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
fio = {}
for line in (out / "fio.txt").read_text().splitlines():
    m = re.match(r"(\d+)-(\w+)-fio-(\w+)-sync(\w+)\.json: .*: ([0-9.]+) GB/s", line)
    if m:
        fio[(int(m[1]), m[3], m[4])] = float(m[5])
agg = defaultdict(lambda: defaultdict(list))
print("| inv | build | size MiB | durable GB/s | durable=false GB/s | medium end sync | fio end sync | "
      "fio sync/2 | durable / end sync | durable / durable=false | durable / fio end sync |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for f in sorted(out.glob("*-*.json"), key=lambda p: int(p.name.split("-")[0])):
    if "fio" in f.name:
        continue
    inv, build = int(f.stem.split("-")[0]), f.stem.split("-")[1]
    j = json.loads(f.read_text())
    for size_mb, d in j["sizes"].items():
        gb = {k: d["bytes"] / statistics.median(v) / 1e9 for k, v in d["times_s"].items()}
        bs = "2M" if float(size_mb) == 2 else "256k"
        fe, f2 = fio.get((inv, bs, "end")), fio.get((inv, bs, "2"))
        dur, nd, end = gb["embedded durable"], gb["embedded durable=false"], gb["medium, end sync"]
        a = agg[(build, size_mb)]
        a["r_end"].append(dur / end)
        a["r_nd"].append(dur / nd)
        a["r_fio"].append(dur / fe)
        a["all"] += [d["bytes"] / t / 1e9 for t in d["times_s"]["embedded durable"]]
        a["all_nd"] += [d["bytes"] / t / 1e9 for t in d["times_s"]["embedded durable=false"]]
        print(f"| {inv} | {build} | {size_mb} | {dur:.2f} | {nd:.2f} | {end:.2f} | {fe:.2f} | {f2:.2f} | "
              f"{dur / end:.2f}x | {dur / nd:.2f}x | {dur / fe:.2f}x |")
print()
print("| build | size MiB | invocations | durable / end sync (median) | durable / durable=false | durable / fio end "
      "sync | durable GB/s, median of all reps | durable=false GB/s, all reps |")
print("|---|---|---|---|---|---|---|---|")
for (build, size_mb), a in sorted(agg.items(), key=lambda x: (x[0][1], x[0][0])):
    med = statistics.median
    print(f"| {build} | {size_mb} | {len(a['r_end'])} | {med(a['r_end']):.2f}x | {med(a['r_nd']):.2f}x | "
          f"{med(a['r_fio']):.2f}x | {med(a['all']):.2f} | {med(a['all_nd']):.2f} |")
