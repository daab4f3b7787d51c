import os, sys, time, statistics, subprocess
from lmcache_adp import CardStore
d = "/dev/shm/of23-fp"; os.makedirs(d, exist_ok=True); p = d + "/card.img"
s = CardStore(p, 8 << 30); data = os.urandom(2 << 20)
n = s.stats()["capacity_bytes"] // ((2 << 20) + 4096) - 40
for i in range(n): s.put(f"f{i}", data)
s.close()
CHILD = """
import sys, time, os
from lmcache_adp import CardStore
s = CardStore(sys.argv[1]); data = os.urandom(2 << 20); t = []
for i in range(20):
    t0 = time.monotonic(); s.put(f"new{sys.argv[2]}-{i}", data); t.append(time.monotonic() - t0)
print(round(s.stats()["recovery_seconds"]*1000,1), [round(x*1000,1) for x in t]); s.close()
"""
for r in range(3):
    for pf in ("1", "0"):
        out = subprocess.run([sys.executable, "-c", CHILD, p, f"{r}{pf}"], env={**os.environ, "ADP_CARD_PREFAULT": pf}, capture_output=True, text=True).stdout
        print("prefault", pf, out.strip())
os.unlink(p)
