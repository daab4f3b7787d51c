import os, sys, time, tempfile, shutil, mmap

sys.path.insert(0, "/work/wt-clientns")
from lmcache_adp import ADPConnector
from tests.support.gateway import Gateway
from tests.helpers import RawConnector

SIZE = 2 << 20
d = tempfile.mkdtemp(prefix="clientns-probe-", dir="/dev/shm")
gw = Gateway(d).start()
N = 16
paths = []


def pool(n):
    p = f"/dev/shm/clientns-pool-{os.getpid()}-{len(paths)}"
    paths.append(p)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, n * SIZE)
    m = mmap.mmap(fd, n * SIZE)
    os.close(fd)
    return m, [memoryview(m)[i * SIZE : (i + 1) * SIZE] for i in range(n)]


sm, src = pool(N)
dm, dst = pool(N)
for v in src:
    v[:] = os.urandom(16) * (SIZE // 16)
c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000))


def snap():
    st = c.conn.stats()
    return {k: st[k] for k in st if k.startswith("gateway_")}


try:
    for r in range(6):
        for op in ("put", "get"):
            b = snap()
            for i in range(0, N, 2):
                ks = [f"p{r}-{i}", f"p{r}-{i + 1}"]
                if op == "put":
                    assert c.set(ks, src[i : i + 2])[0]
                else:
                    assert c.get(ks, dst[i : i + 2])[0]
            a = snap()
            n = a[f"gateway_{op}_slices"] - b[f"gateway_{op}_slices"]
            print(
                r,
                op,
                n,
                "setup us/slice %.1f" % ((a[f"gateway_{op}_setup_ns"] - b[f"gateway_{op}_setup_ns"]) / n / 1e3),
                "rt %.1f" % ((a[f"gateway_{op}_round_trip_ns"] - b[f"gateway_{op}_round_trip_ns"]) / n / 1e3),
            )
finally:
    c.conn.close()
    gw.stop()
    shutil.rmtree(d, ignore_errors=True)
    for p in paths:
        os.unlink(p)
