# SPDX-License-Identifier: Apache-2.0
# Does reading a /dev/shm pool after ADP (embedded, tmpfs card) stored from it / loaded into it get slower?
import mmap, os, select, sys, time
import numpy as np, torch
sys.path.insert(0, "/work/wt-gw")
from lmcache_adp import ADPConnector
MIB = 1 << 20
N, SZ = 32, 32 * MIB
mode = sys.argv[1]  # adp | torch
path = f"/dev/shm/gwx-pool-{os.getpid()}"
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, 2 * N * SZ)
pool = mmap.mmap(fd, 2 * N * SZ)
os.unlink(path)
t = torch.frombuffer(pool, dtype=torch.uint8)
src = [t[i * SZ:(i + 1) * SZ] for i in range(N)]
dst = [t[(N + i) * SZ:(N + i + 1) * SZ] for i in range(N)]
kv = torch.empty(N * SZ, dtype=torch.uint8)
kv.fill_(1)
for s in src:
    s.copy_(torch.randint(0, 255, (SZ,), dtype=torch.uint8))
def retrieve(bufs):
    t0 = time.perf_counter()
    for i, b in enumerate(bufs):
        kv[i * SZ:(i + 1) * SZ].copy_(b)
    return time.perf_counter() - t0
print("retrieve from src before:", [round(retrieve(src), 3) for _ in range(3)])
if mode == "adp":
    conn = ADPConnector(card="/dev/shm/gwx-card.img", card_size_gb=4, num_workers=4)
    def run(op, keys, bufs):
        fid = (conn.submit_batch_set if op == "set" else conn.submit_batch_get)(keys, [memoryview(b.numpy()) for b in bufs])
        while True:
            select.select([conn.event_fd()], [], [], 1)
            for c in conn.drain_completions():
                if c[0] == fid:
                    return c
    keys = [f"m@0@0@{i}" for i in range(N)]
    print(run("set", keys, src)[1])
    print("retrieve from src after adp store:", [round(retrieve(src), 3) for _ in range(3)])
    print(run("get", keys, dst)[1])
else:
    for s, d in zip(src, dst):
        d.copy_(s)
print("retrieve from dst after load:", [round(retrieve(dst), 3) for _ in range(3)])
print("retrieve from src:", [round(retrieve(src), 3) for _ in range(3)])
