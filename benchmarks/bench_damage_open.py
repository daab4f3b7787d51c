#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Open time of a card with one damaged object header in every region, against the same card undamaged.

Recovery walks one 4 KiB block per record; behind a damaged object header it reads the blocks one by one up to the
next header that checks out (docs/card_format.md, Recovery, "Damage that reads back wrong"). This measures what that
costs at open: a card image on the disk under test is filled with objects, copied, and in the copy one object
header per region is flipped (its payload_bytes: the header checksum fails); then both are opened read-only (nothing
written, so every open sees the same image), alternately, --repeat times each. Reported: recovery_seconds (the
card's own figure for its walk) and the wall time of the open, per image, and the damage counters.

Run from the repository root, on the tree under test (built in place):
    PYTHONPATH=. python benchmarks/bench_damage_open.py --dir /var/tmp/adp-damage-bench
Writes benchmarks/results/<date>-damage-open.md and the raw samples to benchmarks/results/raw/<date>-damage-open/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from lmcache_adp import CardStore

MIB = 1 << 20
BLOCK = 4096


def fill(path: str, card_bytes: int, object_bytes: int) -> dict:
    s = CardStore(path, card_bytes)
    st = s.stats()
    n = st["capacity_bytes"] // (object_bytes + BLOCK) - 2  # below the first eviction
    data = bytearray(os.urandom(object_bytes))
    for i in range(n):
        struct.pack_into("<Q", data, 0, i)
        s.put(f"bench-{i:06d}", data)
    st = s.stats()
    s.close()
    return st


def damage(path: str, where: str) -> int:
    """Flips payload_bytes (its lowest bit) of one object header of the region's epoch per region: the first
    record after the region's continuation, or its middle one. Returns how many were flipped."""
    with open(path, "r+b") as f:
        sb = f.read(BLOCK)
        region_bytes, num_regions = struct.unpack_from("<QI", sb, 24)
        (data_offset,) = struct.unpack_from("<Q", sb, 40)
        flipped = 0
        for r in range(num_regions):
            base = data_offset + r * region_bytes
            f.seek(base)
            region = f.read(region_bytes)
            if region[:8] != b"ADPREGN1":
                continue
            (epoch,) = struct.unpack_from("<Q", region, 16)
            (cont,) = struct.unpack_from("<Q", region, 40)
            heads, off = [], BLOCK + cont
            while off + BLOCK <= region_bytes and region[off : off + 8] == b"ADPOBJT1":
                if struct.unpack_from("<Q", region, off + 16)[0] != epoch:
                    break
                heads.append(off)
                (payload,) = struct.unpack_from("<Q", region, off + 40)
                off += BLOCK + (payload + BLOCK - 1) // BLOCK * BLOCK
            if not heads:
                continue
            at = heads[0] if where == "first" else heads[len(heads) // 2]
            f.seek(base + at + 40)
            f.write(bytes([region[at + 40] ^ 1]))
            flipped += 1
    return flipped


def open_once(path: str) -> dict:
    t0 = time.monotonic()
    s = CardStore(path, read_only=True)
    wall = time.monotonic() - t0
    st = s.stats()
    s.close()
    keys = ("recovery_seconds", "recovered_objects", "recovery_damaged_regions", "recovery_lost_objects")
    return {"wall_s": wall, **{k: st[k] for k in keys}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/adp-damage-bench")
    ap.add_argument("--card-gb", type=float, default=4)
    ap.add_argument("--object-mb", type=float, default=2)
    ap.add_argument("--where", choices=("first", "mid"), default="first")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tag", default="damage-open")
    args = ap.parse_args()
    work = Path(args.dir) / f"run-{os.getpid()}"
    work.mkdir(parents=True)
    clean, damaged = str(work / "clean.img"), str(work / "damaged.img")
    try:
        st = fill(clean, int(args.card_gb * (1 << 30)), int(args.object_mb * MIB))
        subprocess.run(["cp", "--sparse=always", clean, damaged], check=True)
        flipped = damage(damaged, args.where)
        samples: dict[str, list[dict]] = {"clean": [], "damaged": []}
        for _ in range(args.repeat):
            for name, path in (("clean", clean), ("damaged", damaged)):
                samples[name].append(open_once(path))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-%H%M")
    results = Path(__file__).resolve().parent / "results"
    raw = results / "raw" / f"{stamp}-{args.tag}"
    raw.mkdir(parents=True, exist_ok=True)
    meta = {
        "argv": sys.argv,
        "regions": st["num_regions"],
        "region_bytes": st["region_bytes"],
        "objects": st["objects"],
        "flipped": flipped,
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    (raw / "samples.json").write_text(json.dumps({"meta": meta, "samples": samples}, indent=1))
    lines = [f"{k}: {v}" for k, v in meta.items()]
    for name, rows in samples.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("recovery_seconds", "wall_s")}
        each = ", ".join(f"{r['recovery_seconds']:.3f}" for r in rows)
        last = rows[-1]
        lines.append(
            f"{name}: recovery_seconds median {med['recovery_seconds']:.3f} (all {each}), wall median "
            f"{med['wall_s']:.3f} s; recovered {last['recovered_objects']}, damaged regions "
            f"{last['recovery_damaged_regions']}, lost {last['recovery_lost_objects']}"
        )
    print("\n".join(lines))
    (raw / "summary.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
