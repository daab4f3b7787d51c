# SPDX-License-Identifier: Apache-2.0
"""Ratios of store_pipeline.cc's (and load_pipeline.cc's) modes to their embedded mode E, pass by pass.

Usage: python benchmarks/probes/store_pipeline_ratios.py PROBE_OUTPUT.txt

For each thread count and object size: every mode's median GB/s over the passes, and the
median (min..max) of its ratio to E measured in the same pass (the modes of one pass run one
after the other, so a pass's ratio compares neighbours in time).
"""

import collections
import re
import statistics
import sys

LINE = re.compile(r"threads (\d+) obj (\d+) MiB (\w) .*?([\d.]+) GB/s")


def main(path: str) -> None:
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                t, o, mode, v = m.groups()
                rows[(int(t), int(o))][mode].append(float(v))
    for key in sorted(rows):
        d = rows[key]
        e = d["E"]
        out = []
        for mode in "MWCGQABPRVD":
            if mode not in d:
                continue
            v = d[mode]
            r = [v[i] / e[i] for i in range(min(len(v), len(e)))]
            out.append(f"{mode} {statistics.median(v):.2f} ({statistics.median(r):.2f}x; {min(r):.2f}..{max(r):.2f})")
        head = f"{key[0]} thr {key[1]} MiB: E {statistics.median(e):.2f} ({min(e):.2f}..{max(e):.2f})"
        print(" | ".join([head, *out]))


if __name__ == "__main__":
    main(sys.argv[1])
