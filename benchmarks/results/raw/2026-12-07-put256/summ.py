# put256: per-store syscall times from probe.sh's `perf trace -s` files (the worker threads: adp-worker-N, adp-twin-N)
# and the store counts printed in steps2-1.txt and steps3-1.txt. usage: python summ.py
import re
from pathlib import Path

here = Path(__file__).parent
log = (here / "steps2-1.txt").read_text() + (here / "steps3-1.txt").read_text()
tags = ("disk-durable-256k", "disk-nodurable-256k", "disk-durable-2m", "shm-durable-256k")
for tag in tags + ("disk-durable-256k-r2", "disk-nodurable-256k-r2", "disk-durable-256k-r3"):
    part = log.split(f"== trace {tag} ")[1].split("== end trace")[0]
    stores = int(re.search(r"stat stores (\d+)", part).group(1))
    wall = sum(float(x) for x in re.search(r"store_s ([\d. ]+) failed", part).group(1).split())
    tot: dict[str, list[float]] = {}
    thread = None
    for line in (here / f"trace-{tag}.txt").read_text().splitlines():
        m = re.match(r"^ (\S+) \(\d+\), \d+ events", line)
        if m:
            thread = m.group(1)
            continue
        m = re.match(r"^\s+(\w+)\s+(\d+)\s+\d+\s+([\d.]+)", line)
        if m and thread and (thread.startswith("adp-worker") or thread.startswith("adp-twin")):
            c = tot.setdefault(m.group(1), [0, 0.0])
            c[0] += int(m.group(2))
            c[1] += float(m.group(3))
    print(f"{tag}: {stores} stores, timed wall {wall:.3f} s = {wall / stores * 1e6:.0f} us a store")
    for sc in ("io_submit", "io_getevents", "pwritev", "fdatasync", "futex", "write"):
        if sc in tot:
            n, ms = tot[sc]
            print(
                f"  {sc:13s} {n:6d} calls ({n / stores:.2f} a store), {ms:9.1f} ms over the worker threads:"
                f" {ms / stores * 1e3:7.1f} us a store, {ms / n * 1e3:7.1f} us a call"
            )
