# SPDX-License-Identifier: Apache-2.0
"""Summary of ab.sh outputs (rows old, new: durable; oldnd, newnd: the same trees with durable=false). Per row the
median GB/s of all its reps; per round (each row's median of its 3 reps) the ratios new/old, old/oldnd, new/newnd,
and each durable row over the round's durable=false rows together (their mean: the two trees' durable=false paths
are the same code); the median over the rounds of each. At the end, the ratios' medians over the rounds of every FILE given together. usage: summ.py FILE..."""
import re
import statistics as st
import sys
from collections import defaultdict

RATIOS = {
    "new/old": lambda r: r["new"] / r["old"],
    "old/oldnd": lambda r: r["old"] / r["oldnd"],
    "new/newnd": lambda r: r["new"] / r["newnd"],
    "old/nd": lambda r: r["old"] / ((r["oldnd"] + r["newnd"]) / 2),
    "new/nd": lambda r: r["new"] / ((r["oldnd"] + r["newnd"]) / 2),
}

pooled = defaultdict(list)
for path in sys.argv[1:]:
    reps, rounds, failed = defaultdict(list), defaultdict(dict), 0
    for line in open(path):
        m = re.match(r"round (\d+) (\w+): store s: .* GB/s: ([0-9. ]+) failed keys: (\d+)", line)
        if not m:
            continue
        gbs = [float(x) for x in m.group(3).split()]
        reps[m.group(2)].extend(gbs)
        rounds[int(m.group(1))][m.group(2)] = st.median(gbs)
        failed += int(m.group(4))
    print(f"{path}: {len(rounds)} rounds, failed keys {failed}")
    print("  GB/s, median of all reps: " + ", ".join(f"{k} {st.median(v):.2f} ({len(v)})" for k, v in reps.items()))
    for name, f in RATIOS.items():
        per = [f(rounds[i]) for i in sorted(rounds) if all(k in rounds[i] for k in ("old", "new", "oldnd", "newnd"))]
        if per:
            print(f"  {name:10s} by round: " + " ".join(f"{x:.2f}" for x in per) + f"  median {st.median(per):.2f}")
            pooled[name] += per
if len(sys.argv) > 2:
    print(f"all {len(sys.argv) - 1} files pooled:")
    for name, per in pooled.items():
        print(f"  {name:10s} {len(per)} rounds, median {st.median(per):.2f} (range {min(per):.2f}-{max(per):.2f})")
