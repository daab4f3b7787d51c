"""Per-op probe: N stores then N loads of S-byte objects through one connector (embedded or gateway segments).
argv: mode(emb|gw) size_kb workers nops [gateway-prefix...]"""
import os, sys, time, subprocess, signal, select, mmap, shutil
sys.path.insert(0, "/work/wt-perop")
import numpy as np
from lmcache_adp import ADPConnector, format_card
mode, size, W, N = sys.argv[1], int(sys.argv[2]) * 1024, int(sys.argv[3]), int(sys.argv[4])
prefix = sys.argv[5:]
d = f"/dev/shm/perop-{os.getpid()}"
os.makedirs(d)
card = f"{d}/card.img"
with open(card, "wb") as f:
    f.truncate(1 << 30)
format_card(card, 0, 64 << 20)
pool_path = f"{d}/l1"
nbuf = max(2 * W * 4, 64)
fd = os.open(pool_path, os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 2 * nbuf * size)
pool = mmap.mmap(fd, 2 * nbuf * size)
os.close(fd)
np.frombuffer(pool, dtype=np.uint8).fill(7)
src = [memoryview(pool)[i * size:(i + 1) * size] for i in range(nbuf)]
dst = [memoryview(pool)[(nbuf + i) * size:(nbuf + i + 1) * size] for i in range(nbuf)]
proc = None
try:
    if mode == "gw":
        log = open(f"{d}/gw.log", "w")
        proc = subprocess.Popen(prefix + [sys.executable, "-m", "lmcache_adp.cli", "gateway", "--card", card, "--socket", f"{d}/gw.sock", "--io-contexts", str(W)], stdout=log, stderr=subprocess.STDOUT)
        t = time.time()
        while "gateway ready" not in open(f"{d}/gw.log").read():
            assert proc.poll() is None and time.time() - t < 60, open(f"{d}/gw.log").read()
            time.sleep(0.05)
        conn = ADPConnector(gateway=f"unix://{d}/gw.sock", num_workers=W, timeout_ms=60000)
    elif mode == "ext":
        conn = ADPConnector(gateway=f"unix://{os.environ['GW_SOCK']}", num_workers=W, timeout_ms=60000)
    else:
        conn = ADPConnector(card=card, num_workers=W, io_depth=W, timeout_ms=60000)
    efd = conn.event_fd(); poller = select.poll(); poller.register(efd, select.POLLIN)
    batch, window = 2 * W, 4
    def drive(op, keys, bufs):
        submit = conn.submit_batch_set if op == "set" else conn.submit_batch_get
        inflight = {}; i = 0; failed = 0
        t0 = time.perf_counter()
        while i < len(keys) or inflight:
            while i < len(keys) and len(inflight) < window:
                k = keys[i:i + batch]
                b = [bufs[(i + j) % len(bufs)] for j in range(len(k))]
                inflight[submit(k, b)] = len(k); i += len(k)
            poller.poll(1000)
            for fid, ok, _e, per in conn.drain_completions():
                n = inflight.pop(fid)
                failed += (0 if ok else n) if (op == "set" or per is None) else sum(not x for x in per)
        return time.perf_counter() - t0, failed
    drive("set", [f"w{j}" for j in range(64)], src)  # warm
    drive("get", [f"w{j}" for j in range(64)], dst)
    keys = [f"k{j:07d}" for j in range(N)]
    ts, fs = drive("set", keys, src)
    tl, fl = drive("get", keys, dst)
    st = conn.stats()
    print(f"{mode} {size>>10}KiB W={W} N={N}: store {ts/N*1e6:.1f} us/op ({N/ts:.0f} ops/s) load {tl/N*1e6:.1f} us/op ({N/tl:.0f} ops/s) failed {fs}/{fl} seg_loads {st.get('segment_loads', '-')}", flush=True)
    conn.close()
finally:
    if proc:
        proc.send_signal(signal.SIGTERM); proc.wait(30)
    shutil.rmtree(d, ignore_errors=True)
