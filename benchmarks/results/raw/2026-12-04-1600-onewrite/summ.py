# SPDX-License-Identifier: Apache-2.0
"""Summary of ab.sh outputs (rows old, new: durable). Per row the median GB/s of all its reps; per round (each row's
median of its 3 reps) the ratio new/old; its median over the rounds; at the end, over every FILE given together.
After raw/2026-12-04-1215-diskstore/summ.py. usage: summ.py FILE..."""
import re
import statistics as st
import sys
from collections import defaultdict

pooled = []
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
    per = [rounds[i]["new"] / rounds[i]["old"] for i in sorted(rounds) if {"old", "new"} <= rounds[i].keys()]
    if per:
        print("  new/old by round: " + " ".join(f"{x:.2f}" for x in per) + f"  median {st.median(per):.2f}")
        pooled += per
if len(sys.argv) > 2 and pooled:
    print(f"all {len(sys.argv) - 1} files pooled: new/old {len(pooled)} rounds, median {st.median(pooled):.2f} "
          f"(range {min(pooled):.2f}-{max(pooled):.2f})")
