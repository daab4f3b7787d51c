# SPDX-License-Identifier: Apache-2.0
"""Probe (brief mapsq32, session 32): what RemoteBackend::find_segment's look at this process's mappings costs in
a process like LMCache's MP server, and what a batch that makes it pays.

The process imports torch and lmcache (their shared objects are most of /proc/self/maps) and allocates an L1 pool
as LMCache does: anonymous (torch.empty, LMCache without --shm-name) or in /dev/shm (lmcache's posix_shm, with
--shm-name). Then:

1. `scan`: maps_scan_cost.cc (built here with g++, loaded with ctypes): one full read of /proc/self/maps as
   find_segment made it before session 32 (median of --scans), the lines it read; and one PROCMAP_QUERY ioctl of
   one pool address, with and without its name.
2. `batch` (anonymous pool only: there every batch's buffers are anonymous, so before session 32 one batch a
   second re-read the whole of /proc/self/maps under the lock every worker's batch takes): a gateway (card on
   /dev/shm) holds W * --per keys of 256 KiB; a connector of W workers loads them into the pool (process memory,
   granted by default). Per cycle: a pause of 1.2 s, one load ("after 1.2 s": find_segment's once-a-second
   re-check falls in it), a pause of 0.5 s, one load ("after 0.5 s": the same idle, no re-check), then --steady
   loads back to back ("steady"). The first two differ only by the re-check (both follow an idle pause).

Run (under flock): flock /work/bench.lock python benchmarks/probes/maps_scan.py --out DIR
Results: benchmarks/results/2026-12-06-1600-maps-scan32.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from first_batch import wait_future  # this script's folder (sys.path[0])

ROOT = Path(__file__).resolve().parents[2]
SIZE = 256 << 10


def build_lib(out: Path) -> ctypes.CDLL:
    so = out / "maps_scan_cost.so"
    src = Path(__file__).with_name("maps_scan_cost.cc")
    subprocess.run(["g++", "-O2", "-std=c++20", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.adp_probe_scan.restype = ctypes.c_int64
    lib.adp_probe_scan.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.adp_probe_query.restype = ctypes.c_int64
    lib.adp_probe_query.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    return lib


class Pool:
    """LMCache's L1 pool: torch.empty (anonymous) or posix_shm's shm_create_readwrite (/dev/shm)."""

    def __init__(self, nbytes: int, shm: bool):
        import torch

        self.nbytes, self.shm = nbytes, shm
        if shm:
            from lmcache.v1.multiprocess import posix_shm

            self.name = f"adp-probe-mapsq-{os.getpid()}"
            self.addr = posix_shm.shm_create_readwrite(self.name, nbytes)
        else:
            self.tensor = torch.empty(nbytes, dtype=torch.uint8)
            self.addr = self.tensor.data_ptr()
        self.raw = (ctypes.c_char * nbytes).from_address(self.addr)

    def views(self, n: int) -> list[memoryview]:
        m = memoryview(self.raw).cast("B")
        return [m[i * SIZE : (i + 1) * SIZE] for i in range(n)]

    def close(self) -> None:
        if self.shm:
            from lmcache.v1.multiprocess import posix_shm

            posix_shm.shm_munmap(self.addr, self.nbytes)
            posix_shm.shm_unlink(self.name)


def scan_costs(lib: ctypes.CDLL, pool: Pool, scans: int) -> dict:
    lines = ctypes.c_int(0)
    ns = [lib.adp_probe_scan(ctypes.byref(lines)) for _ in range(scans)]
    q = lib.adp_probe_query(pool.addr + 4096, 10000, 0)
    qn = lib.adp_probe_query(pool.addr + 4096, 10000, 1)
    return {"maps_lines": lines.value, "scan_us_median": statistics.median(ns) / 1e3, "scan_us_min": min(ns) / 1e3,
            "scan_us_max": max(ns) / 1e3, "query_us": q / 1e7 if q >= 0 else None,
            "query_with_name_us": qn / 1e7 if qn >= 0 else None}  # fmt: skip


def batches(url: str, pool: Pool, workers: int, per: int, cycles: int, steady: int) -> dict:
    from lmcache_adp import ADPConnector

    n = workers * per
    keys = [f"probe@mapsq@{i:x}" for i in range(n)]
    views = pool.views(n)
    conn = ADPConnector(gateway=url, num_workers=workers, timeout_ms=10000)
    rows: dict[str, list[float]] = {"after 1.2 s": [], "after 0.5 s": [], "steady": []}

    def load() -> float:
        t0 = time.perf_counter()
        ok, err = wait_future(conn, conn.submit_batch_get(list(keys), list(views)))
        assert ok, err
        return (time.perf_counter() - t0) * 1e3

    try:
        for _ in range(3):  # every worker connected, the pool's pages touched
            load()
        for _ in range(cycles):
            time.sleep(1.2)
            rows["after 1.2 s"].append(load())
            time.sleep(0.5)
            rows["after 0.5 s"].append(load())
            for _ in range(steady):
                rows["steady"].append(load())
        st = conn.stats()
    finally:
        conn.close()
    return {"workers": workers, "keys": n, "ms": rows,
            "process_loads": st.get("process_loads")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--per", type=int, default=4, help="keys a worker")
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--steady", type=int, default=5)
    ap.add_argument("--scans", type=int, default=30)
    ap.add_argument("--pool-mb", type=int, default=512)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))  # this tree's lmcache_adp and tests.support (a script: not at import)
    import lmcache.v1.multiprocess.server  # noqa: F401  (what LMCache's MP server imports)
    import torch  # noqa: F401

    from lmcache_adp import ADPConnector
    from tests.support.gateway import Gateway

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lib = build_lib(out)
    result: dict = {"scan": {}, "batch": []}
    for shm in (False, True):
        pool = Pool(a.pool_mb << 20, shm)
        try:
            r = scan_costs(lib, pool, a.scans)
        finally:
            pool.close()
        result["scan"]["shm" if shm else "anonymous"] = r
        print(f"{'shm' if shm else 'anonymous'} pool: {r}", flush=True)
    worker_counts = [int(w) for w in a.workers.split(",")]
    d = tempfile.mkdtemp(prefix="adpmapsq-", dir="/dev/shm")
    gw = Gateway(d, card_size_gb=0.25).start()
    pool = Pool(a.pool_mb << 20, False)
    try:
        n = max(worker_counts) * a.per
        c = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000)
        src = [memoryview(bytes([i & 0xFF]) * SIZE) for i in range(n)]
        ok, err = wait_future(c, c.submit_batch_set([f"probe@mapsq@{i:x}" for i in range(n)], src))
        assert ok, err
        c.close()
        for w in worker_counts:
            r = batches(gw.unix_url, pool, w, a.per, a.cycles, a.steady)
            result["batch"].append(r)
            med = {k: statistics.median(v) for k, v in r["ms"].items()}
            print(f"W={w} ({r['keys']} keys): " + ", ".join(f"{k} median {v:.2f} ms" for k, v in med.items())
                  + f"; process_loads {r['process_loads']}", flush=True)  # fmt: skip
    finally:
        gw.stop()
        (out / "gateway.log").write_text(gw.all_logs())
        shutil.rmtree(d, ignore_errors=True)
        pool.close()
    (out / "maps_scan.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
