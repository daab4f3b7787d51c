# Session 23's firstput.py (raw/2026-12-05-0001-openfast23-first-puts/), extended: the trees to compare are
# given as arguments (each child imports lmcache_adp from its tree), and each child waits for the prefault's
# "mapped in" line after its 20 puts so that the prefault's total time is printed too.
# usage: firstput.py ROUNDS LABEL=TREE [LABEL=TREE ...]   (the fill uses the first tree)
import os, sys, subprocess

rounds = int(sys.argv[1])
trees = [a.split("=", 1) for a in sys.argv[2:]]
d = "/dev/shm/pf24-fp"; os.makedirs(d, exist_ok=True); p = d + "/card.img"
FILL = """
import os, sys
from lmcache_adp import CardStore
s = CardStore(sys.argv[1], 8 << 30); data = os.urandom(2 << 20)
n = s.stats()["capacity_bytes"] // ((2 << 20) + 4096) - 40
for i in range(n): s.put(f"f{i}", data)
s.close()
"""
subprocess.run([sys.executable, "-c", FILL, p], cwd=trees[0][1], check=True, capture_output=True)
CHILD = """
import sys, time, os, select
from lmcache_adp import CardStore
r, w = os.pipe(); saved = os.dup(2); os.dup2(w, 2)  # our stderr (the log) into a pipe we read
s = CardStore(sys.argv[1]); data = os.urandom(2 << 20); t = []
for i in range(20):
    t0 = time.monotonic(); s.put(f"new{sys.argv[2]}-{i}", data); t.append(time.monotonic() - t0)
log, end = b"", time.monotonic() + (5 if os.environ.get("ADP_CARD_PREFAULT") != "0" else 0)
while b"mapped in" not in log and time.monotonic() < end:
    if select.select([r], [], [], 0.05)[0]: log += os.read(r, 65536)
pf = [l for l in log.decode().splitlines() if "mapped in" in l]
print(round(s.stats()["recovery_seconds"]*1000,1), [round(x*1000,1) for x in t],
      "prefault:", pf[0].split("mapped in")[1].strip() if pf else "-")
s.close()
"""
for r in range(rounds):
    for label, tree in trees:
        for pf in ("1", "0"):
            out = subprocess.run([sys.executable, "-c", CHILD, p, f"{r}{label}{pf}"], cwd=tree,
                                 env={**os.environ, "ADP_CARD_PREFAULT": pf}, capture_output=True, text=True)
            print(label, "prefault", pf, out.stdout.strip() or out.stderr[-500:], flush=True)
os.unlink(p)
