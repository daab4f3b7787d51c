#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per load in a probe_l1_reads.py strace log (strace -f -tt -T -e trace=read,preadv): the reads of at least
1 MiB grouped into loads (a pause of over 150 ms between them), and per load: its syscall (preadv: the card,
read: fs_native), reads, threads, span, time-weighted reads in flight, the median read, and the time between one
read's end and the same thread's next read (the worker's CPU between reads: the card's CRC, fs_native's close
and open).

    python strace_gaps.py TRACE
"""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/, for strace_reads
from strace_reads import in_flight, parse  # noqa: E402

rs = sorted(parse(sys.argv[1], {"read", "preadv"}, 1 << 20))
groups, cur = [], [rs[0]]
for r in rs[1:]:
    if r[0] - max(x[1] for x in cur) > 0.15:
        groups.append(cur)
        cur = [r]
    else:
        cur.append(r)
groups.append(cur)
for g in groups:
    first, last = min(r[0] for r in g), max(r[1] for r in g)
    mean, _ = in_flight(g)
    gaps = []
    for tid in {r[5] for r in g}:
        x = sorted(r for r in g if r[5] == tid)
        gaps += [b[0] - a[1] for a, b in zip(x, x[1:], strict=False)]
    took = statistics.median(r[1] - r[0] for r in g) * 1e3
    line = (f"{g[0][2]:<7} {len(g)} reads, {len({r[5] for r in g})} threads, {last - first:.3f} s, in flight mean "
            f"{mean:.2f}; read median {took:.1f} ms")
    if gaps:
        line += (f"; gaps median {statistics.median(gaps) * 1e3:.2f} ms, max {max(gaps) * 1e3:.2f}, "
                 f"sum {sum(gaps) * 1e3:.0f} ms over {len(gaps)}")
    print(line)
