#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Open time of a card with one damaged object header in every region, against the same card undamaged.

Recovery walks one 4 KiB block per record; behind a damaged object header it reads the blocks one by one up to the
next header that checks out (docs/card_format.md, Recovery, "Damage that reads back wrong"). This measures what that
costs at open: a card image on the disk under test is filled with objects, copied, and in the copy one object
header per region is flipped (its payload_bytes: the header checksum fails); then both are opened read-only (nothing
written, so every open sees the same image), alternately, --repeat times each. Reported: recovery_seconds (the
card's own figure for its walk) and the wall time of the open, per image, and the damage counters.

--damage region flips one bit of every region header's checksum instead (each region taken as free; what the
damage cost is looked for behind it: find_behind_damage). --tree NAME=PATH (repeatable) opens each image with the
lmcache_adp of each tree in turn (a child process each open, PYTHONPATH=PATH), so a before and an after are measured
in one invocation, alternately, on the same images.

--open rw measures what a read-write open costs instead (docs/card_format.md, Recovery: an open pads each crash's cut
to its region's end and syncs once, since session 22): one image, no damage, opened as `closed`, as the tree under
test left it at its close (since session 23 a clean close pads the frontier's tail, so the open finds no cut), and
as `cut`, the same with that pad zeroed: what a crash after the last store leaves, and what every close before
session 23 left. The tail's block is put back (or zeroed) before each open, so every open of `closed` or `cut` sees
the same bytes. Each open is read-write, in a child process with each --tree's lmcache_adp. Reported as above, plus
how many opens changed the tail's block (closed: none wanted).

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


def region_bases(f) -> tuple[int, list[int]]:
    """The region size and each region's offset, read from the superblock of the card image open as f."""
    f.seek(0)
    sb = f.read(BLOCK)
    region_bytes, num_regions = struct.unpack_from("<QI", sb, 24)
    (data_offset,) = struct.unpack_from("<Q", sb, 40)
    return region_bytes, [data_offset + r * region_bytes for r in range(num_regions)]


def damage(path: str, where: str) -> int:
    """Flips payload_bytes (its lowest bit) of one object header of the region's epoch per region: the first
    record after the region's continuation, or its middle one. Returns how many were flipped."""
    with open(path, "r+b") as f:
        region_bytes, bases = region_bases(f)
        flipped = 0
        for base in bases:
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


def damage_region_headers(path: str) -> int:
    """Flips one bit of every region header's checksum (a region header of this card that does not check out:
    damage; its epoch field intact). Returns how many were flipped."""
    with open(path, "r+b") as f:
        flipped = 0
        for base in region_bases(f)[1]:
            f.seek(base)
            head = f.read(56)
            if head[:8] != b"ADPREGN1":
                continue
            f.seek(base + 52)
            f.write(bytes([head[52] ^ 1]))
            flipped += 1
    return flipped


def tail_pad(path: str) -> int:
    """The offset of the pad over the frontier region's unwritten tail (the region of the highest epoch: its chain
    of records followed from its continuation to a pad record running to the region's end), or -1."""
    with open(path, "rb") as f:
        region_bytes, bases = region_bases(f)
        newest, base = -1, -1
        for b in bases:
            f.seek(b)
            head = f.read(56)
            if head[:8] == b"ADPREGN1" and struct.unpack_from("<Q", head, 16)[0] > newest:
                newest, base = struct.unpack_from("<Q", head, 16)[0], b
        if base < 0:
            return -1
        f.seek(base)
        region = f.read(region_bytes)
    (cont,) = struct.unpack_from("<Q", region, 40)
    off = BLOCK + cont
    while off + BLOCK <= region_bytes and region[off : off + 8] == b"ADPOBJT1":
        payload, flags = struct.unpack_from("<QI", region, off + 40)
        if flags & 4 and off + BLOCK + payload == region_bytes:  # a pad to the region's end
            return base + off
        off += BLOCK + (payload + BLOCK - 1) // BLOCK * BLOCK
    return -1


def read_block(path: str, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(BLOCK)


def write_block(path: str, offset: int, block: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(block)
        f.flush()
        os.fsync(f.fileno())


KEYS = ("recovery_seconds", "recovered_objects", "recovery_damaged_regions", "recovery_lost_objects")

# One open in a child process, with the lmcache_adp its PYTHONPATH names (-P: not the working directory's).
OPEN_IN_CHILD = f"""
import json, sys, time
from lmcache_adp import CardStore
t0 = time.monotonic()
s = CardStore(sys.argv[1], read_only=sys.argv[2] == "ro")
wall = time.monotonic() - t0
st = s.stats()
s.close()
print(json.dumps({{"wall_s": wall, **{{k: st[k] for k in {KEYS!r}}}}}))
"""


def open_once(path: str, tree: str | None = None, mode: str = "ro") -> dict:
    if tree:
        env = {**os.environ, "PYTHONPATH": tree}
        r = subprocess.run(
            [sys.executable, "-P", "-c", OPEN_IN_CHILD, path, mode], env=env, capture_output=True, text=True
        )
        if r.returncode:
            raise RuntimeError(f"open with {tree} failed: {r.stderr}")
        return json.loads(r.stdout.splitlines()[-1])
    t0 = time.monotonic()
    s = CardStore(path, read_only=mode == "ro")
    wall = time.monotonic() - t0
    st = s.stats()
    s.close()
    return {"wall_s": wall, **{k: st[k] for k in KEYS}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/adp-damage-bench")
    ap.add_argument("--card-gb", type=float, default=4)
    ap.add_argument("--object-mb", type=float, default=2)
    ap.add_argument("--where", choices=("first", "mid"), default="first")
    ap.add_argument("--damage", choices=("object", "region"), default="object")
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH: open with that tree's lmcache_adp")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--open", choices=("ro", "rw"), default="ro", help="rw: read-write opens of a closed and a cut image"
    )
    ap.add_argument("--tag", default="damage-open")
    args = ap.parse_args()
    work = Path(args.dir) / f"run-{os.getpid()}"
    work.mkdir(parents=True)
    clean, damaged = str(work / "clean.img"), str(work / "damaged.img")
    try:
        st = fill(clean, int(args.card_gb * (1 << 30)), int(args.object_mb * MIB))
        pad_at, pad = -1, b""
        if args.open == "rw":  # one image, its tail's pad put back or zeroed before each open
            pad_at = tail_pad(clean)
            if pad_at < 0:
                raise SystemExit("--open rw: the closed image has no pad over its frontier's tail (a tree before 23?)")
            pad = read_block(clean, pad_at)
            flipped = 0
            images = (("closed", clean, pad), ("cut", clean, bytes(BLOCK)))
        else:
            subprocess.run(["cp", "--sparse=always", clean, damaged], check=True)
            flipped = damage(damaged, args.where) if args.damage == "object" else damage_region_headers(damaged)
            images = (("clean", clean, b""), ("damaged", damaged, b""))
        trees = dict(t.split("=", 1) for t in args.tree) or {"": None}
        samples: dict[str, list[dict]] = {}
        for _ in range(args.repeat):
            for tree, tree_path in trees.items():
                for image, path, tail in images:
                    name = f"{tree} {image}".strip()
                    if tail:
                        write_block(path, pad_at, tail)
                    row = open_once(path, tree_path, args.open)
                    if tail:
                        row["tail_block_changed"] = read_block(path, pad_at) != tail
                    samples.setdefault(name, []).append(row)
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
        "open": args.open,
        "damage": args.damage if args.open == "ro" else "none",
        "flipped": flipped,
        "tail_pad_at": pad_at,
        "trees": trees,
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
            + (
                f"; tail block changed by {sum(r['tail_block_changed'] for r in rows)} of {len(rows)} opens"
                if pad_at >= 0
                else ""
            )
        )
    print("\n".join(lines))
    (raw / "summary.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
