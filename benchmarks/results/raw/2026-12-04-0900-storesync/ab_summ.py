# SPDX-License-Identifier: Apache-2.0
"""ab.sh output: per row (old, new durable; nd: new durable=false) the median and every rep's GB/s, and new/old and
old, new over nd per round (medians of the round's 3 reps)."""
import re
import statistics
import sys
from collections import defaultdict

for f in sys.argv[1:]:
    rows, per = defaultdict(list), defaultdict(dict)
    for line in open(f):
        m = re.match(r"round (\d+) (\w+): .*GB/s: ([0-9. ]+) failed keys: (\d+)", line)
        if m:
            gb = [float(x) for x in m[3].split()]
            rows[m[2]] += gb
            per[int(m[1])][m[2]] = statistics.median(gb)
    print(f)
    for k in rows:
        print(f"  {k}: median {statistics.median(rows[k]):.2f} GB/s of {len(rows[k])} reps")
    for k in (k for k in ("new", "new2") if k in rows):
        r = [per[i][k] / per[i]["old"] for i in sorted(per)]
        print(f"  {k}/old by round:", " ".join(f"{x:.2f}" for x in r), f"median {statistics.median(r):.2f}")
    for k in (k for k in rows if k != "nd"):
        r = [per[i][k] / per[i]["nd"] for i in sorted(per)]
        print(f"  {k}/durable=false by round:", " ".join(f"{x:.2f}" for x in r), f"median {statistics.median(r):.2f}")
