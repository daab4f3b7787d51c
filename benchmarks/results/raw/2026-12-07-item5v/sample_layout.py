#!/usr/bin/env python3
"""item5v: the on-disk layout of what the tiers stored, every 10 s until killed (one JSON line a sample): for the
fs_native files and for the card image under WORKDIR, how many files, extents and bytes (filefrag -v: FIEMAP),
and the extents' sizes (a 32 MiB O_DIRECT read is split at every extent boundary, and at 4 MiB:
/sys/block/vda/queue/max_sectors_kb)."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

work, out = Path(sys.argv[1]), open(sys.argv[2], "w", buffering=1)
EXT = re.compile(r"^\s*\d+:\s+\d+\.\.\s*\d+:\s+\d+\.\.\s*\d+:\s+(\d+):")


def extents(paths: list[Path]) -> dict:
    if not paths:
        return {}
    r = subprocess.run(["filefrag", "-v", *map(str, paths)], capture_output=True, text=True)
    lens = [int(m.group(1)) * 4096 for m in map(EXT.match, r.stdout.splitlines()) if m]
    lens.sort()
    return {"files": len(paths), "extents": len(lens), "bytes": sum(lens),
            "median_extent_kib": lens[len(lens) // 2] // 1024 if lens else 0,
            "under_4mib": sum(1 for x in lens if x < 4 << 20)}


while True:
    fs = sorted((work / "fs_native").glob("*.data")) if (work / "fs_native").is_dir() else []
    cards = sorted(work.glob("card*.img"))
    out.write(json.dumps({"t": round(time.time(), 3), "fs_native": extents(fs), "card": extents(cards)}) + "\n")
    time.sleep(10)
