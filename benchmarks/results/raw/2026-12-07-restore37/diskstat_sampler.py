#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Samples the disk's counters every --period seconds until killed: wall time, /proc/diskstats' fields of
DEV (reads completed, sectors read, ms reading, in flight, io ms, weighted ms) and /sys/block/DEV/inflight.

    python diskstat_sampler.py OUT.tsv [--dev vda] [--period 0.002]
"""

import argparse
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--dev", default="vda")
ap.add_argument("--period", type=float, default=0.002)
a = ap.parse_args()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
stats = open("/proc/diskstats")
infl = open(f"/sys/block/{a.dev}/inflight")
with open(a.out, "w", buffering=1 << 20) as out:
    out.write("t\treads\tsectors_read\tms_reading\tin_flight\tio_ms\tweighted_ms\tinflight_r\tinflight_w\n")
    try:
        while True:
            t = time.time()
            stats.seek(0)
            for line in stats:
                f = line.split()
                if f[2] == a.dev:
                    break
            infl.seek(0)
            r, w = infl.read().split()
            # diskstats: 3 reads, 4 merged, 5 sectors, 6 ms reading, ..., 11 in flight, 12 io ms, 13 weighted ms
            out.write(f"{t:.6f}\t{f[3]}\t{f[5]}\t{f[6]}\t{f[11]}\t{f[12]}\t{f[13]}\t{r}\t{w}\n")
            time.sleep(a.period)
    except (KeyboardInterrupt, SystemExit):
        pass
