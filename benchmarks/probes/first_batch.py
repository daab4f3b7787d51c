# SPDX-License-Identifier: Apache-2.0
"""Probe (brief start31, session 31): what the first batch a connector's workers serve costs when only worker 0
connects at start (Connector::worker_loop: BackendSession::prepare on worker 0 alone).

One gateway (card on /dev/shm). For each transport (ring: anonymous buffers, process_memory false; process:
anonymous buffers, process memory granted; segments: buffers in one /dev/shm file) and worker count W, each
repetition starts a fresh connector, waits for the gateway to count its start-up connection (clients == 1; then
up to 0.5 s for W, where every worker connects at start, and 0.2 s idle), then submits loads of W keys (W slices, one a worker where each takes one) until the gateway counts W connections
(the "first" batches: the workers that were not connected connect inside them), then `--steady` more loads of the
same keys ("steady"). Per batch: its latency (submit to completion, polled on the eventfd), the connections the
gateway counts after it, and its slices' setup time (gateway_get_setup_ns: from a worker taking its slice to its
first request written: a connect made inside the slice counts there).

Run (under flock, 2-core VM): flock /work/bench.lock python benchmarks/probes/first_batch.py --out DIR
Results and reading: benchmarks/results/2026-12-06-1019-first-batch31.md (no change made: the first batch's extra
is first use, not the connect).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import select
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wait_future(conn, fid: int, timeout: float = 30.0) -> tuple[bool, str]:
    poller = select.poll()
    poller.register(conn.event_fd(), select.POLLIN)
    deadline = time.monotonic() + timeout
    while True:
        for c in conn.drain_completions():
            if c[0] == fid:
                return c[1], c[2]
        if time.monotonic() > deadline:
            raise TimeoutError(f"future {fid}")
        poller.poll(100)


def clients(url: str) -> int:
    from lmcache_adp.gateway_stats import read_gateway_stats

    return read_gateway_stats(url)["clients"]


class Bufs:
    def __init__(self, n: int, size: int, shm: bool):
        self.path = None
        if shm:
            self.path = f"/dev/shm/adp-probe-fb-{os.getpid()}"
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fd, n * size)
            self.map = mmap.mmap(fd, n * size)
            os.close(fd)
            self.views = [memoryview(self.map)[i * size : (i + 1) * size] for i in range(n)]
        else:
            self.views = [memoryview(bytearray(size)) for _ in range(n)]

    def close(self) -> None:
        for v in self.views:
            v.release()
        if self.path:
            self.map.close()
            os.unlink(self.path)


def one_run(url: str, transport: str, workers: int, keys: list[str], size: int, steady: int) -> dict:
    from lmcache_adp import ADPConnector

    params = {"gateway": url, "num_workers": workers, "timeout_ms": 10000}
    if transport == "ring":
        params["process_memory"] = False
    deadline = time.monotonic() + 30
    while clients(url) > 0:  # the previous run's connections given back (the gateway counts them until then)
        assert time.monotonic() < deadline, "connections left over"
        time.sleep(0.01)
    base = 0
    conn = ADPConnector(**params)
    bufs = Bufs(len(keys), size, shm=transport == "segments")
    rows = []
    try:
        deadline = time.monotonic() + 30
        while clients(url) < base + 1:  # worker 0's start-up connect
            assert time.monotonic() < deadline, "no start-up connect"
            time.sleep(0.01)
        # Where every worker connects at start: those connections too (main: worker 0's only, 0.5 s waited).
        until = time.monotonic() + 0.5
        while clients(url) < workers and time.monotonic() < until:
            time.sleep(0.01)
        time.sleep(0.2)  # the start-up threads done and the connector idle, as one between start and first traffic
        first = True
        for _ in range(200):
            st0 = conn.stats()
            t0 = time.perf_counter()
            fid = conn.submit_batch_get(list(keys), list(bufs.views))
            ok, err = wait_future(conn, fid)
            dt = time.perf_counter() - t0
            assert ok, err
            # A worker counts its slice's times just after the completion is made: waited for here.
            until = time.monotonic() + 5
            while (st1 := conn.stats())["worker_get_slices"] - st0["worker_get_slices"] < len(keys):
                assert time.monotonic() < until, "slices not counted"
                time.sleep(0.001)
            slices = st1["gateway_get_slices"] - st0["gateway_get_slices"]
            setup = (st1["gateway_get_setup_ns"] - st0["gateway_get_setup_ns"]) / max(1, slices)
            n = clients(url) - base
            rows.append({"phase": "first" if first else "steady", "ms": dt * 1e3, "conns_after": n,
                         "setup_us_per_slice": setup / 1e3})  # fmt: skip
            if first and n >= workers:
                first = False
                left = steady
            elif not first:
                left -= 1
                if left == 0:
                    break
    finally:
        conn.close()
        bufs.close()
    return {"transport": transport, "workers": workers, "batches": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="4,8")
    ap.add_argument("--transports", default="ring,process,segments")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steady", type=int, default=20)
    ap.add_argument("--size-kb", type=int, default=256)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))  # this tree's lmcache_adp and tests.support (a script: not at import)
    from lmcache_adp import ADPConnector
    from tests.support.gateway import Gateway

    size = a.size_kb * 1024
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    worker_counts = [int(w) for w in a.workers.split(",")]
    keys = [f"probe@fb@0@{i:x}" for i in range(max(worker_counts))]
    d = tempfile.mkdtemp(prefix="adpfb-", dir="/dev/shm")
    gw = Gateway(d, card_size_gb=0.25).start()
    results = []
    try:
        c = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000)
        b = Bufs(len(keys), size, shm=False)
        for i, v in enumerate(b.views):
            v[:] = bytes([i & 0xFF]) * size
        fid = c.submit_batch_set(list(keys), list(b.views))
        ok, err = wait_future(c, fid)
        assert ok, err
        c.close()
        b.close()
        for rep in range(a.reps):
            for t in a.transports.split(","):
                for w in worker_counts:
                    r = one_run(gw.unix_url, t, w, keys[:w], size, a.steady)
                    r["rep"] = rep
                    results.append(r)
                    f = [x for x in r["batches"] if x["phase"] == "first"]
                    s = [x["ms"] for x in r["batches"] if x["phase"] == "steady"]
                    print(
                        f"rep {rep} {t:8s} W={w}: first batches "
                        + ", ".join(f"{x['ms']:.2f} ms ({x['conns_after']} conns, setup {x['setup_us_per_slice']:.0f} us/slice)" for x in f)
                        + f"; steady median {statistics.median(s):.2f} ms, max {max(s):.2f} ms",
                        flush=True,
                    )  # fmt: skip
    finally:
        gw.stop()
        (out / "gateway.log").write_text(gw.all_logs())
        shutil.rmtree(d, ignore_errors=True)
    (out / "first_batch.json").write_text(json.dumps(results, indent=1))
    # Summary: per transport and W, the first batch's latency against the steady median of its run.
    lines = ["| transport | W | first batch ms (median of reps) | steady median ms | first/steady | first setup us/slice | steady setup us/slice | conns after first |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in a.transports.split(","):
        for w in worker_counts:
            rs = [r for r in results if r["transport"] == t and r["workers"] == w]
            f1 = [r["batches"][0] for r in rs]
            st = [statistics.median([x["ms"] for x in r["batches"] if x["phase"] == "steady"]) for r in rs]
            ss = [statistics.median([x["setup_us_per_slice"] for x in r["batches"] if x["phase"] == "steady"]) for r in rs]  # fmt: skip
            firsts = ", ".join(f"{x['ms']:.1f}" for x in f1)
            fm, sm = statistics.median(x["ms"] for x in f1), statistics.median(st)
            lines.append(
                f"| {t} | {w} | {fm:.2f} ({firsts}) | {sm:.2f} | {fm / sm:.1f}x | "
                f"{statistics.median(x['setup_us_per_slice'] for x in f1):.0f} | {statistics.median(ss):.0f} | "
                f"{', '.join(str(x['conns_after']) for x in f1)} |"
            )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
