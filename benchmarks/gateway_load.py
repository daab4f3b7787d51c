# SPDX-License-Identifier: Apache-2.0
"""Load test of the gateway through the ring (issue 9): one connector with many
workers and a large ring, large objects, several batches in flight, several
passes of stores then loads; every hit's bytes are checked. Prints one JSON
line with failed futures, wrong bytes and throughput.

    python benchmarks/gateway_load.py --workers 16 --object-mb 32 --ring-mb 1024 \
        --keys-per-batch 16 --in-flight 4 --passes 4 --card-dir /dev/shm

Needs only the built package (no LMCache): it drives ADPConnector as LMCache's
native adapter does (submit, poll the eventfd, drain).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

MIB = 1 << 20


_BASE: dict[int, np.ndarray] = {}


def pattern(i: int, size: int, salt: int) -> np.ndarray:
    """Distinct bytes per key and pass (one random block, rotated by a
    per-key, per-pass offset): cheap to build and to check, and a misplaced
    or stale object does not match."""
    if size not in _BASE:
        _BASE[size] = np.random.default_rng(12345).integers(0, 256, size=size, dtype=np.uint8)
    return np.roll(_BASE[size], (i * 4099 + salt * 131071) % size)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--object-mb", type=int, default=32)
    ap.add_argument("--ring-mb", type=int, default=1024)
    ap.add_argument("--keys-per-batch", type=int, default=16)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--batches", type=int, default=8, help="batches per pass (distinct keys: batches x keys)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--io-contexts", type=int, default=16)
    ap.add_argument("--timeout-ms", type=int, default=10000)
    ap.add_argument("--card-dir", default="/dev/shm")
    ap.add_argument("--card-gb", type=float, default=0)
    ap.add_argument("--gateway-args", default="", help="extra gateway flags")
    a = ap.parse_args()

    # This tree's package when it is built in place (bench_connector's rule), otherwise the installed one: a
    # clone installed with `pip install .` has no _native beside its sources (audit 13: ModuleNotFoundError).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if runpy.run_path(os.path.join(root, "lmcache_adp", "source_digest.py"))["native_module"](
        os.path.join(root, "lmcache_adp")
    ):
        sys.path.insert(0, root)
    from lmcache_adp import ADPConnector
    from lmcache_adp.log import showing_info

    size = a.object_mb * MIB
    nkeys = a.batches * a.keys_per_batch
    # Regions hold whole objects: room for two regions per object is plenty.
    card_gb = a.card_gb or max(1.0, nkeys * 2 * (size + MIB) * 1.25 / (1 << 30))
    work = tempfile.mkdtemp(prefix="adpload-", dir=os.path.abspath(a.card_dir))  # the gateway runs in it
    sock = os.path.join(tempfile.mkdtemp(prefix="adps-", dir="/tmp"), "gw.sock")
    log_path = os.path.join(work, "gateway.log")
    gw_cmd = [sys.executable, "-m", "lmcache_adp.cli", "gateway", "--card", os.path.join(work, "card.img")]
    gw_cmd += ["--card-size-gb", str(card_gb), "--socket", sock, "--io-contexts", str(a.io_contexts)]
    gw_cmd += a.gateway_args.split()
    logf = open(log_path, "w")
    import lmcache_adp

    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(lmcache_adp.__file__)))
    env = showing_info({**os.environ, "PYTHONPATH": pkg_root + os.pathsep + os.environ.get("PYTHONPATH", "")})
    gw = subprocess.Popen(gw_cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=work)  # not a checkout's cwd
    try:
        t0 = time.monotonic()
        while "gateway ready" not in open(log_path).read():
            if gw.poll() is not None or time.monotonic() - t0 > 60:
                print(open(log_path).read(), file=sys.stderr)
                return 1
            time.sleep(0.05)
        conn = ADPConnector(gateway="unix://" + sock, num_workers=a.workers, ring_mb=a.ring_mb, timeout_ms=a.timeout_ms)
        poller = select.poll()
        poller.register(conn.event_fd(), select.POLLIN)
        keys = [[f"load@{b:04x}@{k:04x}" for k in range(a.keys_per_batch)] for b in range(a.batches)]
        res = {"failed_futures": 0, "failed_keys": 0, "checked": 0, "wrong_bytes": 0, "misses": 0, "errors": []}
        phases = []

        def run(kind: str, salt: int) -> None:
            # Buffers are built before the clock starts and loads are checked
            # after it stops: the timed part is the connector and the gateway.
            if kind == "store":
                all_bufs = [
                    [pattern(b * 1000 + k, size, salt) for k in range(a.keys_per_batch)] for b in range(a.batches)
                ]
            else:
                all_bufs = [[np.zeros(size, np.uint8) for _ in range(a.keys_per_batch)] for _ in range(a.batches)]
            hits: list[tuple[int, int]] = []
            pending: dict[int, int] = {}
            queue = list(range(a.batches))
            moved = 0
            t = time.monotonic()
            while queue or pending:
                while queue and len(pending) < a.in_flight:
                    b = queue.pop(0)
                    views = [memoryview(x) for x in all_bufs[b]]
                    submit = conn.submit_batch_set if kind == "store" else conn.submit_batch_get
                    pending[submit(keys[b], views)] = b
                if not poller.poll(1000):
                    continue
                for fid, ok, err, per_key in conn.drain_completions():
                    b = pending.pop(fid)
                    if not ok:
                        res["failed_futures"] += 1
                        if len(res["errors"]) < 5:
                            res["errors"].append(f"{kind}: {err}")
                    for k, hit in enumerate(per_key):
                        if not hit:
                            res["failed_keys" if kind == "store" else "misses"] += 1
                            continue
                        moved += size
                        hits.append((b, k))
            dt = time.monotonic() - t
            if kind == "load":
                for b, k in hits:
                    res["checked"] += 1
                    if not np.array_equal(all_bufs[b][k], pattern(b * 1000 + k, size, salt)):
                        res["wrong_bytes"] += 1
            phases.append({"phase": kind, "seconds": round(dt, 3), "GBps": round(moved / dt / 1e9, 3)})

        for p in range(a.passes):
            run("store", p)
            run("load", p)
        conn.close()
        res["futures"] = 2 * a.passes * a.batches
        res["phases"] = phases
        res["config"] = vars(a)
        print(json.dumps(res))
        return 0 if res["failed_futures"] == 0 and res["wrong_bytes"] == 0 else 3
    finally:
        gw.send_signal(signal.SIGTERM)
        try:
            gw.wait(60)
        except subprocess.TimeoutExpired:
            gw.kill()
        logf.close()
        if os.environ.get("ADP_LOAD_KEEP_LOG"):
            shutil.copy(log_path, os.environ["ADP_LOAD_KEEP_LOG"])
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(os.path.dirname(sock), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
