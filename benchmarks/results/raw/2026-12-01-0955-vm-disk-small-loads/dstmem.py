# SPDX-License-Identifier: Apache-2.0
"""Does the destination memory change an O_DIRECT read's time on this disk? One read of header block +
payload per object, into (a) one reused buffer mapped with MAP_POPULATE (as a worker's staging), (b) the
object's own slice of a large buffer zeroed before each round (as LMCache's L1 in `lmcache bench l2`),
(c) as (b) plus a copy from a reused buffer (staged). 1 or 4 threads, interleaved rounds.
Usage: python dstmem.py DIR SIZE_KB THREADS ROUNDS"""
import ctypes, mmap, os, sys, threading, time, statistics
import numpy as np
d, kb, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
size = kb * 1024; stride = size + 4096; n_obj = 128
path = os.path.join(d, f"dm-{os.getpid()}.img")
with open(path, "wb") as f:
    chunk = os.urandom(1 << 20)
    for _ in range((n_obj * stride >> 20) + 1): f.write(chunk)
    f.flush(); os.fsync(f.fileno())
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
MAP_POPULATE = 0x8000
big = mmap.mmap(-1, n_obj * size)  # L1-like: faulted by zeroing
bigarr = np.frombuffer(big, dtype=np.uint8)
def run(mode):
    nxt = [0]; lock = threading.Lock()
    bigarr[:] = 0
    def work():
        stage = mmap.mmap(-1, stride, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_POPULATE)
        st = np.frombuffer(stage, dtype=np.uint8)
        hdr = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_POPULATE)
        while True:
            with lock:
                i = nxt[0]; nxt[0] += 1
            if i >= n_obj: return
            off = i * stride
            dst = memoryview(big)[i * size:(i + 1) * size]
            if mode == "reused":
                os.preadv(fd, [stage], off)
            elif mode == "l1":
                os.preadv(fd, [hdr, dst], off)
            elif mode == "staged":
                os.preadv(fd, [stage], off); np.copyto(bigarr[i * size:(i + 1) * size], st[4096:])
    ts = [threading.Thread(target=work) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    return time.perf_counter() - t0
res = {m: [] for m in ("reused", "l1", "staged")}
for r in range(rounds):
    for m in res: res[m].append(run(m))
os.close(fd); os.unlink(path)
print(f"{kb} KiB, {threads} threads, {n_obj} objects x {rounds} rounds, load {os.getloadavg()[0]:.1f}")
for m in res:
    med = statistics.median(res[m])
    print(f"  {m:8s} {n_obj*size/med/2**20:7.0f} MiB/s (median round)")
