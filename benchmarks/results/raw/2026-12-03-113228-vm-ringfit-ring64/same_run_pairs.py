# SPDX-License-Identifier: Apache-2.0
"""Same-run pairs of two gateway rows of one bench_connector.py --interleave run: per repetition, row a's GB/s over
row b's (the two measured in the same repetition). Usage: python same_run_pairs.py raw/STAMP/rows.json"""

import json
import statistics
import sys

PAIRS = [
    ("gateway unix+process", "gateway unix+ring, ring_mb 64"),
    ("gateway unix+ring, ring_mb 64", "gateway unix+ring, ring_mb 63"),
]

rows = json.load(open(sys.argv[1]))["rows"]


def find(label: str, mb: float) -> dict | None:
    return next((r for r in rows if r["row"] == label and r["object_mb"] == mb), None)


for mb in sorted({r["object_mb"] for r in rows}):
    for a, b in PAIRS:
        ra, rb = find(a, mb), find(b, mb)
        if not ra or not rb:
            continue
        for op in ("store_s", "load_s"):
            rat = [tb / ta for ta, tb in zip(ra[op], rb[op], strict=True)]  # GB/s of a / GB/s of b
            each = ", ".join(f"{x:.2f}" for x in rat)
            print(
                f"{mb:g} MiB {op[:-2]:5s} {a} / {b}: per rep {each}; "
                f"median {statistics.median(rat):.2f}x ({min(rat):.2f}..{max(rat):.2f})"
            )
