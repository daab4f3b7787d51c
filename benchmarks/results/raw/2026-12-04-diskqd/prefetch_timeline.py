#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The timeline of each L2->L1 prefetch of an MP server, from an strace log and the server logs.

For a `bench_restore.py` run under `strace -f -tt -T -e trace=read,pread64,preadv,preadv2 -o LOG`:
each prefetch that LMCache logged as loaded from L2 ("Prefetch request completed ... (0 L1, N L2) in
D ms") is the window [logged time - D, logged time]; the reads of at least --min-bytes inside it
(by the server's threads) are listed as: the gap from the window's start to the first read, from
the last read's end to the window's end, reads in flight per --bin, and per thread the time between
one read's end and its next read's start (the CPU a load spends after its read: a CRC, the
completion).

    python benchmarks/results/raw/2026-12-04-diskqd/prefetch_timeline.py LOG SERVER.log [SERVER.log ...] [--bin 0.02]
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/, for strace_reads
from strace_reads import in_flight, parse, seconds  # noqa: E402

DONE = re.compile(
    r"\[(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),(\d{3})\].*Prefetch request completed.*\((\d+) L1, (\d+) L2\) in ([\d.]+) ms"
)


def windows(log: str) -> list[tuple[float, float, int]]:
    """(start, end, L2 keys) of each prefetch that loaded from L2, in seconds of the day."""
    out = []
    for line in open(log, errors="replace"):
        m = DONE.search(line)
        if m and int(m.group(5)) > 0:
            end = seconds(f"{m.group(2)}.{m.group(3)}000")
            out.append((end - float(m.group(6)) / 1e3, end, int(m.group(5))))
    return out


def describe(name: str, w: tuple[float, float, int], reads: list, bin_s: float) -> None:
    start, end, keys = w
    rs = [r for r in reads if r[0] >= start - 0.005 and r[1] <= end + 0.005]
    if not rs:
        print(f"{name} {datetime.timedelta(seconds=start)}: {keys} keys in {end - start:.3f} s, no reads")
        return
    first, last = min(r[0] for r in rs), max(r[1] for r in rs)
    mean, most = in_flight(rs)
    total = sum(r[4] for r in rs)
    print(
        f"{name} {datetime.timedelta(seconds=start)}: {keys} keys in {end - start:.3f} s; {len(rs)} reads "
        f"({rs[0][2]}), {total / 2**20:.0f} MiB, {len({r[5] for r in rs})} threads; start->first read "
        f"{(first - start) * 1e3:.1f} ms, reads {last - first:.3f} s ({total / 2**30 / (last - first):.2f} GiB/s), "
        f"last read->end {(end - last) * 1e3:.1f} ms; in flight mean {mean:.2f} max {most}"
    )
    took = [r[1] - r[0] for r in rs]
    print(f"    read time: median {statistics.median(took) * 1e3:.1f} ms, min {min(took) * 1e3:.1f}, max {max(took) * 1e3:.1f}")
    gaps = []
    for tid in sorted({r[5] for r in rs}):
        x = sorted(r for r in rs if r[5] == tid)
        gaps += [b[0] - a[1] for a, b in zip(x, x[1:], strict=False)]
    if gaps:
        print(
            f"    between a thread's reads: median {statistics.median(gaps) * 1e3:.2f} ms, "
            f"max {max(gaps) * 1e3:.2f} ms, sum {sum(gaps) * 1e3:.1f} ms over {len(gaps)} gaps"
        )
    cells = []
    t = first
    while t < last:
        level = sum(min(r[1], t + bin_s) - max(r[0], t) for r in rs if r[0] < t + bin_s and r[1] > t) / bin_s
        cells.append(f"{level:.1f}")
        t += bin_s
    print(f"    in flight per {bin_s * 1e3:.0f} ms from the first read: " + " ".join(cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--bin", type=float, default=0.02)
    ap.add_argument("--syscalls", default="read,pread64,preadv,preadv2")
    args = ap.parse_args()
    reads = parse(args.trace, set(args.syscalls.split(",")), args.min_bytes)
    for log in args.logs:
        for w in windows(log):
            describe(Path(log).stem, w, reads, args.bin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
