# SPDX-License-Identifier: Apache-2.0
"""Why is an O_DIRECT read into LMCache's L1 slower than into a reused buffer? One read of header block +
payload per object into: reused (one populated buffer per thread), l1-zeroed (the object's slice of a
large buffer zeroed before each round, as `lmcache bench l2` does), l1-warm (the same slices, not
written by the CPU since the last round's reads), small-zeroed (slices of a region of 8 objects,
zeroed before each round: small footprint, just written). Interleaved rounds; /proc/diskstats reads
per object (vda, shared with other users of the disk).
Usage: python dstmem2.py DIR SIZE_KB THREADS ROUNDS"""
import mmap, os, sys, threading, time, statistics
import numpy as np
d, kb, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
size = kb * 1024; stride = size + 4096; n_obj = 128
path = os.path.join(d, f"dm2-{os.getpid()}.img")
with open(path, "wb") as f:
    chunk = os.urandom(1 << 20)
    for _ in range((n_obj * stride >> 20) + 1): f.write(chunk)
    f.flush(); os.fsync(f.fileno())
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
MAP_POPULATE = 0x8000
big = mmap.mmap(-1, n_obj * size); bigarr = np.frombuffer(big, dtype=np.uint8); bigarr[:] = 0
small = mmap.mmap(-1, 8 * size); smallarr = np.frombuffer(small, dtype=np.uint8)
def diskreads():
    for line in open("/proc/diskstats"):
        p = line.split()
        if p[2] == "vda": return int(p[3])
def run(mode):
    nxt = [0]; lock = threading.Lock()
    if mode == "l1-zeroed": bigarr[:] = 0
    if mode == "small-zeroed": smallarr[:] = 0
    def work():
        stage = mmap.mmap(-1, stride, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_POPULATE)
        hdr = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_POPULATE)
        while True:
            with lock:
                i = nxt[0]; nxt[0] += 1
            if i >= n_obj: return
            off = i * stride
            if mode == "reused":
                os.preadv(fd, [stage], off)
            elif mode.startswith("l1"):
                os.preadv(fd, [hdr, memoryview(big)[i * size:(i + 1) * size]], off)
            else:
                j = i % 8
                os.preadv(fd, [hdr, memoryview(small)[j * size:(j + 1) * size]], off)
    ts = [threading.Thread(target=work) for _ in range(threads)]
    r0 = diskreads(); t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    dt = time.perf_counter() - t0
    ios[mode].append((diskreads() - r0) / n_obj)
    return dt
res = {m: [] for m in ("reused", "l1-zeroed", "l1-warm", "small-zeroed")}
ios = {m: [] for m in res}
for r in range(rounds):
    for m in res: res[m].append(run(m))
os.close(fd); os.unlink(path)
print(f"{kb} KiB, {threads} threads, {n_obj} objects x {rounds} rounds, load {os.getloadavg()[0]:.1f}")
for m in res:
    med = statistics.median(res[m])
    print(f"  {m:13s} {n_obj*size/med/2**20:7.0f} MiB/s (median round)  disk reads/object (vda, shared) median {statistics.median(ios[m]):.2f}")
