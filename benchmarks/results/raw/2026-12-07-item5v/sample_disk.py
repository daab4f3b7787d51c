#!/usr/bin/env python3
"""item5v: samples the guest's dirty page cache and vda's counters every 0.2 s until killed (one CSV line a
sample): wall time, MemInfo Dirty and Writeback (KiB), and /proc/diskstats of vda: reads, sectors read,
ms reading, writes, sectors written, ms writing, in flight, ms busy, flushes, ms flushing, discards, sectors discarded, ms discarding; the 1-minute load average."""
import sys
import time

out = open(sys.argv[1], "w", buffering=1)
out.write("t,dirty_kib,writeback_kib,reads,rsect,rms,writes,wsect,wms,inflight,busy_ms,flushes,flush_ms,discards,dsect,dms,load1\n")
while True:
    mem = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Dirty", "Writeback"):
                mem[k] = int(v.split()[0])
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == "vda":
                d = [int(x) for x in p[3:]]
    # fields: 0 reads 2 rsect 3 rms 4 writes 6 wsect 7 wms 8 inflight 9 busy_ms 11 discards 13 dsect 14 dms 15 flushes 16 flush_ms
    fl = (d[15], d[16]) if len(d) > 16 else (0, 0)
    row = [d[0], d[2], d[3], d[4], d[6], d[7], d[8], d[9], *fl, d[11], d[13], d[14]]
    out.write(f"{time.time():.3f},{mem['Dirty']},{mem['Writeback']}," + ",".join(map(str, row)) + "," + open("/proc/loadavg").read().split()[0] + "\n")
    time.sleep(0.2)
