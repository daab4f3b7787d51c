# SPDX-License-Identifier: Apache-2.0
"""Capacity of a card: payload held against card size and object size.

Method: a fresh card image of each size; an ADPConnector (embedded, the
given worker count, other settings default) stores objects of one size, one
object per future, with as many futures in flight as there are workers (all
workers write at once), until 1.25x the card's size has been stored. After
every completion the stats are read. Reported:
  - held at the first eviction (the store's first_eviction_held_bytes, read
    at the end): the payload the card held at the instant of its first
    eviction, the objects indexed then plus the stores then reserved and
    being written that were acknowledged afterwards (a key counted once);
    with it, how many stores were in flight then, and how many of those were
    acknowledged and failed. The store whose reservation made the eviction
    is not counted: it did not fit without it. Writers are never held back
    for this figure: it is taken as the stores run;
  - committed at a completion (the figure before 2026-12-01's second run):
    the most payload of indexed objects seen at a completion while nothing
    had been evicted yet; it misses the stores still being written when the
    card filled (up to workers - 1 objects);
  - steady: payload held at the end, after 1.25x the card was stored and the
    oldest evicted;
each as a share of the card's size (the image) and, for the first, of
capacity_bytes (the regions). Payload bytes are zeros: the store does not
look at them.

    python benchmarks/bench_capacity.py --dir /dev/shm --cards 2,4 --sizes 0.25,2,3,32,48,64 --workers 1,8,16

--impl DIR imports lmcache_adp from DIR (a built tree of another commit), so
two formats can be measured in one run. Writes a markdown table to stdout
(and --output).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from tools import emit_table

CHILD = r"""
import json, os, select, sys, time
impl, card, card_gib, obj_mib, workers = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
if impl:
    sys.path.insert(0, impl)
from lmcache_adp import ADPConnector
import lmcache_adp
size = int(obj_mib * (1 << 20))
card_bytes = int(card_gib * (1 << 30))
c = ADPConnector(card=card, card_size_gb=card_gib, num_workers=workers)
buf = memoryview(bytearray(size))
poller = select.poll()
poller.register(c.event_fd(), select.POLLIN)
stored = 0
first = 0
i = 0
failed = 0
t0 = time.time()
inflight = set()
while stored < 1.25 * card_bytes or inflight:
    while stored < 1.25 * card_bytes and len(inflight) < workers:
        inflight.add(c.submit_batch_set([f"obj-{i}"], [buf]))
        i += 1
        stored += size
    poller.poll(100)
    for cpl in c.drain_completions():
        inflight.discard(cpl[0])
        failed += 0 if cpl[1] else 1
        st = c.stats()
        if st["evicted_objects"] == 0:
            first = max(first, st["objects"] * size)
st = c.stats()
c.close()
print(json.dumps({"first": first, "steady": st["objects"] * size, "capacity": st["capacity_bytes"],
                  "held": st.get("first_eviction_held_bytes"), "inflight": st.get("first_eviction_inflight_stores"),
                  "acked": st.get("first_eviction_inflight_acked"), "ifailed": st.get("first_eviction_inflight_failed"),
                  "region": st["region_bytes"], "card": card_bytes, "failed": failed,
                  "seconds": time.time() - t0, "impl": os.path.dirname(lmcache_adp.__file__)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/dev/shm", help="where the card images go (removed after each run)")
    ap.add_argument("--cards", default="2,4", help="card sizes, GiB")
    ap.add_argument("--sizes", default="0.25,2,3,32,48,64", help="object sizes, MiB")
    ap.add_argument("--workers", default="1,8,16")
    ap.add_argument("--impl", action="append", default=[], help="NAME=DIR: measure the tree built in DIR too")
    ap.add_argument("--output")
    args = ap.parse_args()
    impls = [("this tree", "")] + [tuple(x.split("=", 1)) for x in args.impl]
    rows = []
    for name, impl in impls:
        for card_gib in [float(x) for x in args.cards.split(",")]:
            for workers in [int(x) for x in args.workers.split(",")]:
                for obj_mib in [float(x) for x in args.sizes.split(",")]:
                    card = os.path.join(args.dir, f"adp-capacity-{os.getpid()}.img")
                    if os.path.exists(card):
                        os.unlink(card)
                    env = dict(os.environ, ADP_LOG_LEVEL="WARNING")
                    cmd = [sys.executable, "-c", CHILD, impl, card, str(card_gib), str(obj_mib), str(workers)]
                    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=os.getcwd())
                    if os.path.exists(card):
                        os.unlink(card)
                    if out.returncode != 0:
                        print(out.stderr[-3000:], file=sys.stderr)
                        raise SystemExit(f"run failed: {name} {card_gib} GiB {obj_mib} MiB {workers} workers")
                    import json

                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    rows.append((name, card_gib, obj_mib, workers, r))
                    print(
                        f"{name}: {card_gib:g} GiB card, {obj_mib:g} MiB objects, {workers} workers: "
                        f"held at 1st eviction {(r.get('held') or 0) / r['card']:.1%} ({r.get('inflight')} in flight, "
                        f"{r.get('acked')} acked), committed {r['first'] / r['card']:.1%}, "
                        f"steady {r['steady'] / r['card']:.1%} of the card "
                        f"({r['seconds']:.0f} s)",
                        flush=True,
                    )
    lines = [
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| format | card GiB | object MiB | workers | region MiB | held at 1st eviction: % of card "
        "| % of capacity_bytes | in flight then: acknowledged / failed | committed at a completion: % of card "
        "| steady (1.25x stored): % of card | % of capacity_bytes | failed stores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, card_gib, obj_mib, workers, r in rows:
        first = r["first"] or 0
        held, inflight = "n/a | n/a", "n/a"  # a tree without the stat
        if r.get("held") is not None:
            held = f"{r['held'] / r['card']:.1%} | {r['held'] / r['capacity']:.1%}"
            inflight = f"{r['inflight']}: {r['acked']} / {r['ifailed']}"
        lines.append(
            f"| {name} | {card_gib:g} | {obj_mib:g} | {workers} | {r['region'] / (1 << 20):.2f} "
            f"| {held} | {inflight} | {first / r['card']:.1%} "
            f"| {r['steady'] / r['card']:.1%} | {r['steady'] / r['capacity']:.1%} | {r['failed']} |"
        )
    emit_table(lines, args.output)


if __name__ == "__main__":
    main()
