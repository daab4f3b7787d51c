#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""hugel1: vda's read counters every 0.1 s until killed (CSV: unix time, reads completed, sectors read, 1-min load),
to get each L2 prefetch's disk read requests (their count and mean size) from its start and end in the server log."""
import sys
import time

out = open(sys.argv[1], "w", buffering=1)
out.write("t,reads,rsect,load1\n")
while True:
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == "vda":
                out.write(f"{time.time():.3f},{p[3]},{p[5]},{open('/proc/loadavg').read().split()[0]}\n")
    time.sleep(0.1)
