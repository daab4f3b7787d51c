# SPDX-License-Identifier: Apache-2.0
"""Store MiB/s (avg over the 8 measured rounds, and min-max) of every bench_l2 pass in the given raw dirs."""
import json
import sys
from pathlib import Path

for d in sys.argv[1:]:
    for f in sorted(p for p in Path(d).glob("*k-*-pass*.json") if not p.name.startswith("fio")):
        op = json.loads(f.read_text())["metrics"]["op_0"]
        print(f"{Path(d).name} {f.stem}: store {op['throughput_avg_mbps']:.0f} MiB/s "
              f"({op['throughput_min_mbps']:.0f}-{op['throughput_max_mbps']:.0f}), {op['total_success']}/{op['total_keys']}")
