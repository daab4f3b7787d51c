# SPDX-License-Identifier: Apache-2.0
"""Prints where the gateway's process loads spent their time, from bench_connector rows.json files of
a run with ADP_LOAD_PROFILE=1 in its environment (benchmarks/README.md, "Session eight: loads"): per
gateway process row, each step's calls, total and mean, per object and per piece.

    python benchmarks/load_profile.py results/raw/<stamp>-<label>/rows.json ...
"""

from __future__ import annotations

import json
import sys

STEPS = "batch object lookup index first_look header combine run piece pin copy unpin sink alive lease write".split()


def main(paths: list[str]) -> None:
    for path in paths:
        for row in json.load(open(path))["rows"]:
            g = row.get("gateway_stats", {})
            if not g.get("load_profile_object_n"):
                continue
            wall = sum(row["load_s"])
            objects, pieces = g["load_profile_object_n"], g.get("load_profile_piece_n", 0)
            print(
                f"{path}: {row['row']}, {row.get('workers')} workers, {row.get('object_mb', '?')} MiB; "
                f"{objects:.0f} objects, {pieces:.0f} pieces, {g.get('process_helper_pieces', 0):.0f} on helpers; "
                f"connection threads in batches {g['load_profile_batch_ns'] / 1e9 / (wall * row['workers']):.0%} "
                "of the load phases"
            )
            print("| step | calls | total ms | us a call | us an object |")
            print("|---|---|---|---|---|")
            for s in STEPS:
                ns, n = g.get(f"load_profile_{s}_ns"), g.get(f"load_profile_{s}_n")
                if n:
                    print(f"| {s} | {n:.0f} | {ns / 1e6:.1f} | {ns / n / 1e3:.2f} | {ns / objects / 1e3:.2f} |")


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):  # was a FileNotFoundError on '--help' (audit 13)
        sys.exit(print(__doc__))
    if not sys.argv[1:]:
        sys.exit(__doc__)
    main(sys.argv[1:])
