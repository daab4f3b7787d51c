#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Item 3 on a disk (issue 10): what bench_connector's "medium O_DIRECT" write row measures against what the
connector's store does, and where the difference goes. One card image, T threads = T workers, interleaved
repetitions (the order reversed every other one), each row moving --total-mb per repetition:

  medium, end sync          bench_connector's medium row: T threads pwritev object-sized blocks, one fdatasync
                            per thread at the end (a crash before it may lose every write of the repetition)
  medium, sync per slice    the same writes, an fdatasync after every K objects of a thread: the connector's
                            durability (a store batch of T x K keys is acknowledged after each worker's slice
                            of K objects is synced), its I/O pattern otherwise
  medium, 2 I/Os + sync     as above, each object written as write_body_then_header writes one (an aligned
                            object above the one-write limit): the body first, then its 4 KiB header block
  medium, 1 I/O + sync      as "sync per slice", each object's header block and body in one pwritev (4 KiB
                            more a write), no CRC: what the one-write path's I/O costs without its CRC
  medium, CRC + 1 I/O + sync  as "sync per slice", each object as the one-write path writes it: its CRC32C
                            computed first (lmcache_adp.crc32c, on the thread), then its header block and body
                            in one pwritev
  medium, 1 I/O             as "end sync", each object's header block and body in one pwritev, no CRC: what the
                            one-write path's I/O costs with no sync per slice (embedded durable=false's medium)
  medium, CRC + 1 I/O       the same after each object's CRC32C on its thread (the one-write path without its sync)
  embedded durable          ADPConnector(num_workers=T, io_depth=T), batches of T x K keys, 4 in flight (as
                            bench_connector): fdatasync per slice
  embedded durable=false    the same without the sync

The fdatasync times of the "sync per slice" rows are kept (median, p90). Prints a table and writes JSON.

  python benchmarks/probe_store_sync.py --dir /var/tmp/probe --sizes-mb 2,32 --workers 2 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
if __name__ == "__main__":  # this tree's package when built in place, here and in its children (as bench_connector)
    from tools import use_own_tree

    use_own_tree(Path(__file__).resolve().parents[1])
import bench_connector as bc  # noqa: E402

BLOCK = 4096


def medium_write(path: Path, bufs: list, threads: int, per_sync: int, header_io: str, syncs: list) -> float:
    """Seconds for `threads` threads to write every buffer to its own object-sized slot (thread t: objects
    t, t + threads, ...); an fdatasync after every `per_sync` objects of a thread (0: once, at the end); with
    `header_io` "2" each object is two writes, its body after one block then that block (write_body_then_header);
    with "1" the block and the body in one pwritev, and with "crc1" the same after its CRC32C (the one-write
    path)."""
    size = len(bufs[0])
    slot = size + BLOCK
    hdr = bc.aligned_buffers(threads, BLOCK)
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)

    def work(t: int) -> None:
        n = 0
        for j in range(t, len(bufs), threads):
            off = j * slot
            if header_io == "2":
                os.pwritev(fd, [bufs[j]], off + BLOCK)
                os.pwritev(fd, [hdr[t]], off)
            elif header_io in ("1", "crc1"):
                if header_io == "crc1":
                    bc.lmcache_adp.crc32c(bufs[j])
                os.pwritev(fd, [hdr[t], bufs[j]], off)
            else:
                os.pwritev(fd, [bufs[j]], off)
            n += 1
            if per_sync and n % per_sync == 0:
                t0 = time.perf_counter()
                os.fdatasync(fd)
                syncs.append(time.perf_counter() - t0)
        if not per_sync or n % per_sync:
            os.fdatasync(fd)

    try:
        return bc.timed_threads(threads, work)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--sizes-mb", default="2,32")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keys-per-worker", type=int, default=2)
    ap.add_argument("--total-mb", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", required=True, help="JSON file for the raw times")
    args = ap.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    T, K = args.workers, args.keys_per_worker
    out = {"args": vars(args), "load_before": os.getloadavg(), "sizes": {}}
    for size_mb in (float(x) for x in args.sizes_mb.split(",")):
        size = round(size_mb * bc.MIB / BLOCK) * BLOCK
        n = max(T, args.total_mb * bc.MIB // size)
        src = bc.aligned_buffers(n, size)
        bc.fill_sources(src, 7)
        dst = bc.aligned_buffers(1, size)
        medium_img, cards = work / "medium.img", (work / "card-d.img", work / "card-n.img")  # a card has one owner
        bc.prefill(medium_img, n * (size + BLOCK))
        region = bc.region_for(size)
        for card in cards:
            bc.prefill(card, bc.card_bytes_for(n * size, size, T, region))
            bc.format_card(str(card), 0, region)
        syncs: dict[str, list] = {
            "medium, sync per slice": [],
            "medium, 2 I/Os + sync": [],
            "medium, 1 I/O + sync": [],
            "medium, CRC + 1 I/O + sync": [],
        }
        times: dict[str, list] = {}
        params = {"num_workers": T, "io_depth": T, "timeout_ms": 60000}
        conns = {
            "embedded durable": bc.Rounds({**params, "card": str(cards[0])}, src, dst, T * K, 4, "d"),
            "embedded durable=false": bc.Rounds(
                {**params, "card": str(cards[1]), "durable": False}, src, dst, T * K, 4, "n"
            ),
        }
        for c in conns.values():
            c.warm()

        def medium(name: str, per_sync: int, header_io: str, img=medium_img, src=src, syncs=syncs) -> float:
            return medium_write(img, src, T, per_sync, header_io, syncs.get(name, []))

        rows = {
            "medium, end sync": lambda: medium("medium, end sync", 0, ""),
            "medium, sync per slice": lambda: medium("medium, sync per slice", K, ""),
            "medium, 2 I/Os + sync": lambda: medium("medium, 2 I/Os + sync", K, "2"),
            "medium, 1 I/O + sync": lambda: medium("medium, 1 I/O + sync", K, "1"),
            "medium, CRC + 1 I/O + sync": lambda: medium("medium, CRC + 1 I/O + sync", K, "crc1"),
            "medium, 1 I/O": lambda: medium("medium, 1 I/O", 0, "1"),
            "medium, CRC + 1 I/O": lambda: medium("medium, CRC + 1 I/O", 0, "crc1"),
        }
        for name, c in conns.items():
            rows[name] = lambda c=c: (c.store(len(c.out["store_s"])), c.out["store_s"][-1])[1]
        for name in rows:  # untimed warm-up of each row
            rows[name]()
            times[name] = []
        for c in conns.values():
            c.out["store_s"].clear()
        for s in syncs.values():
            s.clear()
        names = list(rows)
        for r in range(args.reps):
            for name in names if r % 2 == 0 else names[::-1]:
                times[name].append(rows[name]())
        failed = {name: c.out["failed_keys"] for name, c in conns.items()}
        for c in conns.values():
            c.finish()
        base = statistics.median(times["medium, end sync"])
        print(f"== {size_mb:g} MiB x {n}, {T} threads/workers, {K} objects a slice, load {os.getloadavg()[0]:.1f}")
        print("| row | GB/s (median) | / medium end sync | each rep GB/s | fdatasync ms p50, p90 |")
        print("|---|---|---|---|---|")
        for name, ts in times.items():
            gb = n * size / statistics.median(ts) / 1e9
            each = " ".join(f"{n * size / t / 1e9:.2f}" for t in ts)
            sy = sorted(syncs.get(name, []))
            sync = f"{sy[len(sy) // 2] * 1e3:.2f}, {sy[len(sy) * 9 // 10] * 1e3:.2f} ({len(sy)})" if sy else ""
            print(f"| {name} | {gb:.2f} | {base / statistics.median(ts):.2f}x | {each} | {sync} |")
        print(f"failed keys: {failed}", flush=True)
        out["sizes"][size_mb] = {"objects": n, "bytes": n * size, "times_s": times, "syncs_s": syncs, "failed": failed}
        for f in (medium_img, *cards):
            f.unlink()
    out["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
