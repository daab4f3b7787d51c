# SPDX-License-Identifier: Apache-2.0
"""What a load of one small object costs on this disk: two O_DIRECT reads (4 KiB header block, then the
payload) against one read of header + payload, 1 and 4 threads, interleaved round by round.
Usage: python roundtrip.py DIR SIZE_KB THREADS ROUNDS"""
import mmap, os, sys, threading, time, statistics
d, kb, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
size = kb * 1024
n_obj = 128
stride = size + 4096
path = os.path.join(d, f"rt-{os.getpid()}.img")
with open(path, "wb") as f:
    chunk = os.urandom(1 << 20)
    for _ in range((n_obj * stride >> 20) + 1):
        f.write(chunk)
    f.flush(); os.fsync(f.fileno())
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
def buf(n):
    m = mmap.mmap(-1, n); m.write(b"\1" * n); return m
def diskreads():
    for line in open("/proc/diskstats"):
        p = line.split()
        if p[2] == "vda": return int(p[3]), int(p[5])
def run(mode):
    nxt = [0]; lock = threading.Lock()
    def work():
        hdr = buf(4096); dst = buf(size); both = buf(stride)
        while True:
            with lock:
                i = nxt[0]; nxt[0] += 1
            if i >= n_obj: return
            off = i * stride
            if mode == "two":
                os.preadv(fd, [hdr], off); os.preadv(fd, [dst], off + 4096)
            elif mode == "one":
                os.preadv(fd, [hdr, dst], off)
            elif mode == "payload":
                os.preadv(fd, [dst], off + 4096)
    ts = [threading.Thread(target=work) for _ in range(threads)]
    r0 = diskreads(); t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    dt = time.perf_counter() - t0; r1 = diskreads()
    return dt, r1[0] - r0[0], (r1[1] - r0[1]) * 512
res = {m: [] for m in ("two", "one", "payload")}
ios = {m: [] for m in res}
for r in range(rounds):
    for m in res:
        dt, nio, nb = run(m)
        res[m].append(dt); ios[m].append(nio)
os.close(fd); os.unlink(path)
print(f"{kb} KiB, {threads} threads, {n_obj} objects x {rounds} rounds, load {os.getloadavg()[0]:.1f}")
for m in res:
    med = statistics.median(res[m])
    print(f"  {m:8s} median {med*1e6/n_obj*threads:7.1f} us/object/thread  {n_obj*size/med/2**20:7.0f} MiB/s payload"
          f"  disk reads/object (vda, shared) median {statistics.median(ios[m])/n_obj:.2f}")
print(f"  two/one time: {statistics.median(res['two'])/statistics.median(res['one']):.2f}")
