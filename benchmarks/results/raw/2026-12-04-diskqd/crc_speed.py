import time, numpy as np, lmcache_adp._native as n
print(n.crc32c_implementation())
b = np.random.randint(0, 255, 32 << 20, dtype=np.uint8)
for sz in (32 << 20, 2 << 20):
    v = memoryview(b[:sz])
    ts = []
    for _ in range(20):
        t = time.perf_counter(); n.crc32c(v); ts.append(time.perf_counter() - t)
    ts.sort(); print(f"{sz>>20} MiB: median {ts[10]*1e3:.2f} ms, min {ts[0]*1e3:.2f} ms ({sz/ts[10]/2**30:.1f} GiB/s)")
