#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The I/O pattern of large reads in an strace log: sizes, threads, reads in flight.

For a log written by `strace -f -tt -T -e trace=read,pread64,preadv,preadv2 -o LOG <cmd>`
(an MP server under bench_restore.py, say): the reads that returned at least
--min-bytes, grouped into bursts (no such read for --gap seconds), and for each
burst and syscall: how many, their sizes, the threads that made them, and the
reads in flight (mean over the burst's time, weighted by time, and the most).

    python benchmarks/strace_reads.py LOG [--min-bytes 4096] [--gap 0.5]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import re
import statistics
import sys

LINE = re.compile(r"^(\d+)\s+(\d\d:\d\d:\d\d\.\d+) (.*)$")
DONE = re.compile(r"= (-?\d+)(?: \S+)? <([\d.]+)>$")
CALL = re.compile(r"^(\w+)\((\d+)")
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>")


def seconds(ts: str) -> float:
    t = datetime.datetime.strptime(ts, "%H:%M:%S.%f")
    return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


def parse(path: str, names: set[str], min_bytes: int) -> list[tuple[float, float, str, int, int, int]]:
    """(start, end, syscall, fd, bytes, tid) of each read of at least min_bytes."""
    pending: dict[int, tuple[str, int]] = {}
    out = []
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", errors="replace") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            tid, t, rest = int(m.group(1)), seconds(m.group(2)), m.group(3)
            r = RESUMED.match(rest)
            if r:
                if tid not in pending:
                    continue
                name, fd = pending.pop(tid)
                d = DONE.search(rest)
                if d and name in names and int(d.group(1)) >= min_bytes:
                    out.append((t - float(d.group(2)), t, name, fd, int(d.group(1)), tid))
                continue
            c = CALL.match(rest)
            if not c:
                continue
            if rest.endswith("<unfinished ...>"):
                pending[tid] = (c.group(1), int(c.group(2)))
                continue
            d = DONE.search(rest)
            if d and c.group(1) in names and int(d.group(1)) >= min_bytes:
                out.append((t, t + float(d.group(2)), c.group(1), int(c.group(2)), int(d.group(1)), tid))
    return sorted(out)


def in_flight(reads: list[tuple[float, float, str, int, int, int]]) -> tuple[float, int]:
    """Time-weighted mean and maximum of the reads in flight, over first start to last end."""
    edges = sorted([(r[0], 1) for r in reads] + [(r[1], -1) for r in reads])
    area, level, most, last = 0.0, 0, 0, edges[0][0]
    for t, d in edges:
        area += level * (t - last)
        level += d
        most = max(most, level)
        last = t
    span = edges[-1][0] - edges[0][0]
    return (area / span if span > 0 else float(level)), most


def size_text(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB" if n % 1024 == 0 else f"{n} B"


def per_thread(rs: list[tuple[float, float, str, int, int, int]]) -> None:
    t0 = min(r[0] for r in rs)
    for size, _count in collections.Counter(r[4] for r in rs).most_common(4):
        took = statistics.median(r[1] - r[0] for r in rs if r[4] == size)
        print(
            f"    reads of {size_text(size)}: median {took * 1e3:.1f} ms ({took * 1e3 / (size / 2**20):.2f} ms per MiB)"
        )
    for tid in sorted({r[5] for r in rs}):
        x = [r for r in rs if r[5] == tid]
        busy = sum(r[1] - r[0] for r in x)
        small = sum(r[1] - r[0] for r in x if r[4] <= 4096)
        gaps = sum(b[0] - a[1] for a, b in zip(x, x[1:], strict=False))
        print(
            f"    thread {tid}: {len(x)} reads, done at {max(r[1] for r in x) - t0:.3f} s, in reads {busy:.3f} s "
            f"({small:.3f} s in reads of <= 4 KiB), between reads {gaps:.3f} s"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--gap", type=float, default=0.5)
    ap.add_argument("--syscalls", default="read,pread64,preadv,preadv2")
    ap.add_argument("--per-thread", action="store_true", help="each thread's time in and between reads")
    args = ap.parse_args()
    reads = parse(args.log, set(args.syscalls.split(",")), args.min_bytes)
    bursts: list[list] = []
    for r in reads:
        if bursts and r[0] - max(x[1] for x in bursts[-1][-64:]) < args.gap:
            bursts[-1].append(r)
        else:
            bursts.append([r])
    for b in bursts:
        by_call = collections.defaultdict(list)
        for r in b:
            by_call[r[2]].append(r)
        for name, rs in by_call.items():
            total = sum(r[4] for r in rs)
            span = max(r[1] for r in rs) - min(r[0] for r in rs)
            sizes = collections.Counter(r[4] for r in rs)
            mean, most = in_flight(rs)
            print(
                f"{datetime.timedelta(seconds=rs[0][0])} {name} ({len({r[3] for r in rs})} fds): {len(rs)} reads, {total / 2**20:.0f} MiB "
                f"in {span:.3f} s ({total / 2**30 / span if span else 0:.2f} GiB/s), "
                f"{len({r[5] for r in rs})} threads, in flight mean {mean:.2f} max {most}; sizes "
                + ", ".join(f"{size_text(s)} x{c}" for s, c in sizes.most_common(4))
            )
            if args.per_thread:
                per_thread(rs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
