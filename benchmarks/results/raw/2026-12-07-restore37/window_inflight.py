#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The disk's reads during each L2->L1 prefetch of a bench_restore run, from diskstat_sampler.py's samples.

Each prefetch that LMCache logged as loaded from L2 ("Prefetch request completed ... (0 L1, N L2) in D ms",
a server log of the run's raw dir) is the window [logged time - D, logged time]. Over it, from the counters
at the samples nearest its ends: GiB read, the read rate, requests completed and their mean size (the kernel
splits a large read at max_sectors_kb), the mean number of read requests in flight (the time reads spent in
the device's queue, /proc/diskstats field 7, over the window's length), that mean times the mean request size
(bytes in flight), and the /sys/block/DEV/inflight samples' mean and maximum.

    python window_inflight.py SAMPLES.tsv RAWDIR
"""

import bisect
import datetime
import re
import statistics
import sys
from pathlib import Path

DONE = re.compile(
    r"\[(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),(\d{3})\].*Prefetch request completed.*\((\d+) L1, (\d+) L2\) in ([\d.]+) ms"
)


def main() -> int:
    samples, raw = sys.argv[1], Path(sys.argv[2])
    rows = []
    for line in open(samples).read().splitlines()[1:]:
        f = line.split("\t")
        if len(f) == 9:
            rows.append([float(f[0])] + [int(x) for x in f[1:]])
    ts = [r[0] for r in rows]
    tz = datetime.datetime.now().astimezone().tzinfo
    for log in sorted(raw.glob("*.log")):
        for line in open(log, errors="replace"):
            m = DONE.search(line)
            if not m or int(m.group(5)) == 0:
                continue
            end_dt = datetime.datetime.strptime(f"{m.group(1)} {m.group(2)}.{m.group(3)}", "%Y-%m-%d %H:%M:%S.%f")
            end = end_dt.replace(tzinfo=tz).timestamp()
            start = end - float(m.group(6)) / 1e3
            i, j = bisect.bisect_left(ts, start), bisect.bisect_right(ts, end) - 1
            if i >= len(rows) or j <= i:
                print(f"{log.stem}: {m.group(2)} no samples")
                continue
            a, b = rows[i], rows[j]
            dt = b[0] - a[0]
            reqs, sect, ms_r = b[1] - a[1], b[2] - a[2], b[3] - a[3]
            gib = sect * 512 / 2**30
            req_mib = sect * 512 / reqs / 2**20 if reqs else 0.0
            depth = ms_r / 1e3 / dt
            inflight = [r[7] for r in rows[i : j + 1]]
            print(
                f"{log.stem:<14} {m.group(2)}.{m.group(3)} prefetch {float(m.group(6)):6.1f} ms, {m.group(5)} L2 keys: "
                f"read {gib:.2f} GiB in {dt * 1e3:.0f} ms ({gib / dt:.2f} GiB/s), {reqs} requests of {req_mib:.2f} MiB, "
                f"reads in flight {depth:.2f} (~{depth * req_mib:.0f} MiB); inflight samples mean "
                f"{statistics.mean(inflight):.2f} max {max(inflight)} (n={len(inflight)})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
