"""Table rows of the disk29 results from bench_restore's reports: L2->L1 (lookup) and whole-restore time added over
the RAM L2 (mock), card and gateway against fs_native. usage: restore_rows.py REPORT.md..."""

import re
import sys

NAMES = {
    "mock": "RAM L2 (mock)",
    "adp": "card, this plugin (embedded)",
    "gw": "card, this plugin (gateway)",
    "fs": "fs_native, O_DIRECT, same disk",
}
for i, path in enumerate(sys.argv[1:], 1):
    text = open(path).read()
    row = {}
    for k, name in NAMES.items():
        m = re.search(r"^\| " + re.escape(name) + r" \| ([\d.]+) \[[^]]*\] \| ([\d.]+) \|", text, re.M)
        row[k] = (float(m.group(1)), float(m.group(2)))  # restore, lookup
    load = re.search(r"load average ([\d.]+) at the start, ([\d.]+) at the end", text)
    (mr, ml), (ar, al), (gr, gl), (fr, fl) = row["mock"], row["adp"], row["gw"], row["fs"]
    print(
        f"| r{i} | {load.group(1)}, {load.group(2)} | {ml:.3f} | {al:.3f} | {gl:.3f} | {fl:.3f} | "
        f"{(al - ml) / (fl - ml):.2f}x | {(gl - ml) / (fl - ml):.2f}x | {ar - mr:+.3f}, {fr - mr:+.3f} "
        f"({(ar - mr) / (fr - mr):.2f}x) | {al / ml:.2f}x | {fl / ml:.2f}x |"
    )
