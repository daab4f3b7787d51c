# Load-robust views of the same 8 GiB /dev/shm card (filled as firstput.py does), for each tree:
#  cpu:    a child opens the card, puts nothing, waits for the prefault's "mapped in" line and prints the
#          prefault's wall time and the process's CPU time (user+sys) over that wait (the prefault thread's,
#          the main thread sleeping in select) -- CPU time is not stretched by other processes' load.
#  strace: a child opens the card and makes 20 puts of 2 MiB under `strace -f -T -e trace=lseek,pwritev`;
#          (-ff: a file per thread) printed: the longest lseek(SEEK_DATA/SEEK_HOLE) of the prefault (its time in
#          the kernel, the image's inode lock held), and the puts' pwritev (headers; the same lock): first, longest.
# usage: mechanism.py ROUNDS LABEL=TREE [LABEL=TREE ...]
import os, re, sys, subprocess, tempfile

rounds = int(sys.argv[1])
trees = [a.split("=", 1) for a in sys.argv[2:]]
d = "/dev/shm/pf24-mech"; os.makedirs(d, exist_ok=True); p = d + "/card.img"
FILL = """
import os, sys
from lmcache_adp import CardStore
s = CardStore(sys.argv[1], 8 << 30); data = os.urandom(2 << 20)
n = s.stats()["capacity_bytes"] // ((2 << 20) + 4096) - 40
for i in range(n): s.put(f"f{i}", data)
s.close()
"""
subprocess.run([sys.executable, "-c", FILL, p], cwd=trees[0][1], check=True, capture_output=True)
CPU = """
import sys, time, os, select, resource
from lmcache_adp import CardStore
r, w = os.pipe(); os.dup2(w, 2)
u0 = resource.getrusage(resource.RUSAGE_SELF)
s = CardStore(sys.argv[1])
u1 = resource.getrusage(resource.RUSAGE_SELF)
log, end = b"", time.monotonic() + 30
while b"mapped in" not in log and time.monotonic() < end:
    if select.select([r], [], [], 0.05)[0]: log += os.read(r, 65536)
u2 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (u2.ru_utime + u2.ru_stime) - (u1.ru_utime + u1.ru_stime)
pf = [l for l in log.decode().splitlines() if "mapped in" in l]
print("prefault wall", pf[0].split("mapped in")[1].strip() if pf else "-", "cpu %.2f s" % cpu)
s.close()
"""
PUTS = """
import sys, os
from lmcache_adp import CardStore
s = CardStore(sys.argv[1]); data = os.urandom(2 << 20)
for i in range(20): s.put(f"new{sys.argv[2]}-{i}", data)
s.close()
"""
for r in range(rounds):
    for label, tree in trees:
        out = subprocess.run([sys.executable, "-c", CPU, p], cwd=tree, capture_output=True, text=True)
        print(label, "cpu:", out.stdout.strip() or out.stderr[-300:], flush=True)
    for label, tree in trees:
        with tempfile.TemporaryDirectory() as t:  # -ff: one file a thread, so no call is split in two lines
            subprocess.run(["strace", "-ff", "-T", "-o", t + "/s", "-e", "trace=lseek,pwritev", sys.executable,
                            "-c", PUTS, p, f"{r}{label}"], cwd=tree, capture_output=True)
            lines = [l for f in sorted(os.listdir(t)) for l in open(os.path.join(t, f)).read().splitlines()]
        seeks = [float(m.group(1)) for l in lines if "SEEK_DATA" in l or "SEEK_HOLE" in l
                 for m in [re.search(r"<([0-9.]+)>$", l)] if m]
        # the puts' pwritev (the main thread's file comes first: the lowest thread id)
        pw = [float(m.group(1)) for l in lines if "pwritev(" in l for m in [re.search(r"<([0-9.]+)>$", l)] if m]
        print(label, "strace: %d SEEK_DATA/SEEK_HOLE, longest %.1f ms; pwritev: first %.1f ms, longest %.1f ms"
              % (len(seeks), 1000 * max(seeks, default=0), 1000 * (pw[0] if pw else 0), 1000 * max(pw, default=0)),
              flush=True)
os.unlink(p)
