# SPDX-License-Identifier: Apache-2.0
"""Index scaling of the card store: lookup cost, memory per object and
recovery time as the object count grows to a million.

Method: one CardStore (the direct binding, durable=False so the run measures
the index, not fdatasync) on a card image; objects of 1 byte (footprint 8 KiB:
header block + one payload block) are added in steps. At each step: the
per-key time of `exists` over 100 k random present keys and 100 k absent ones,
through the binding (one Python call per key, so the figure includes about
0.1 us of call overhead); the growth of the process's anonymous resident memory
(RssAnon: the store's heap, not the card it maps) per object since the empty card; then
the card is closed and reopened and the recovery time is read from its stats; "reopened": the anonymous
memory a fresh process gains by opening that card (recovery included), per object: the
store's own memory.

    PYTHONPATH=. python benchmarks/bench_index.py --card /dev/shm/index.img --steps 10000,100000,1000000

(PYTHONPATH=. makes the tree's own lmcache_adp the one imported: run as a
script, the benchmarks/ directory comes first on sys.path, not the tree.)

Writes a markdown table to stdout (and --output).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

from tools import emit_table

from lmcache_adp import CardStore

FOOTPRINT = 8192


def anon_rss_bytes() -> int:
    """The process's resident anonymous memory (RssAnon): the store's heap (index, key lists), not the card
    image it maps. VmRSS counted the mapped /dev/shm card too (RssShmem), 8 KiB for each 1-byte object touched."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


REOPEN = """
import sys
sys.path.insert(0, sys.argv[3])
from bench_index import anon_rss_bytes
from lmcache_adp import CardStore
base = anon_rss_bytes()
s = CardStore(sys.argv[1], durable=False)
print((anon_rss_bytes() - base) / int(sys.argv[2]))
s.close()
"""


def reopen_rss_per_object(card: str, n: int) -> float:
    """Anonymous memory a fresh process gains by opening (recovering) the card, per object:
    the store's own memory, without this process's Python garbage."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", REOPEN, card, str(n), here], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def key(i: int) -> str:
    return f"meta-llama/Llama-3.1-8B@00000000@0@{i:016x}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--card", required=True, help="card image path (removed first)")
    ap.add_argument("--steps", default="10000,100000,1000000")
    ap.add_argument("--output")
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    size = int(max(steps) * FOOTPRINT * 1.15) + (64 << 20)
    if os.path.exists(args.card):
        os.unlink(args.card)

    store = CardStore(args.card, size, durable=False)
    base_rss = anon_rss_bytes()
    rows = []
    n = 0
    for target in steps:
        t0 = time.perf_counter()
        while n < target:
            store.put(key(n), b"x")
            n += 1
        insert_s = time.perf_counter() - t0
        rss_per_obj = (anon_rss_bytes() - base_rss) / n
        probe = [key(random.randrange(n)) for _ in range(100_000)]
        t0 = time.perf_counter()
        hits = sum(map(store.exists, probe))
        lookup_us = (time.perf_counter() - t0) / len(probe) * 1e6
        assert hits == len(probe)
        absent = [key(n + i) for i in range(100_000)]
        t0 = time.perf_counter()
        assert not any(map(store.exists, absent))
        miss_us = (time.perf_counter() - t0) / len(absent) * 1e6
        del probe, absent  # the next step's RSS must not count them
        store.close()
        reopened_per_obj = reopen_rss_per_object(args.card, n)
        store = CardStore(args.card, durable=False)
        st = store.stats()
        assert st["objects"] == n
        rows.append((n, insert_s, lookup_us, miss_us, rss_per_obj, reopened_per_obj, st["recovery_seconds"]))
        print(
            f"{n} objects: lookup hit {lookup_us:.2f} us, miss {miss_us:.2f} us, "
            f"{rss_per_obj:.0f} B/object ({reopened_per_obj:.0f} reopened), recovery {st['recovery_seconds']:.2f} s",
            flush=True,
        )
    store.close()
    os.unlink(args.card)

    lines = [
        "| objects | insert s (step) | exists hit us/key | exists miss us/key | anon RSS B/object | anon RSS B/object, reopened "
        "| recovery s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {n} | {ins:.1f} | {hit:.2f} | {miss:.2f} | {rss:.0f} | {ro:.0f} | {rec:.2f} |"
        for n, ins, hit, miss, rss, ro, rec in rows
    ]
    emit_table(lines, args.output)


if __name__ == "__main__":
    main()
