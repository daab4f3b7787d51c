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
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

MIB = 1 << 20


def pattern(i: int, size: int, salt: int) -> np.ndarray:
    """Distinct bytes per key and pass; cheap to build and to check."""
    rng = np.random.default_rng(i * 7919 + salt)
    return rng.integers(0, 256, size=size, dtype=np.uint8)


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

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree's package
    from lmcache_adp import ADPConnector

    size = a.object_mb * MIB
    nkeys = a.batches * a.keys_per_batch
    # Regions hold whole objects: room for two regions per object is plenty.
    card_gb = a.card_gb or max(1.0, nkeys * 2 * (size + MIB) * 1.25 / (1 << 30))
    work = tempfile.mkdtemp(prefix="adpload-", dir=a.card_dir)
    sock = os.path.join(tempfile.mkdtemp(prefix="adps-", dir="/tmp"), "gw.sock")
    log_path = os.path.join(work, "gateway.log")
    gw_cmd = [sys.executable, "-m", "lmcache_adp.cli", "gateway", "--card", os.path.join(work, "card.img")]
    gw_cmd += ["--card-size-gb", str(card_gb), "--socket", sock, "--io-contexts", str(a.io_contexts)]
    gw_cmd += a.gateway_args.split()
    logf = open(log_path, "w")
    import lmcache_adp

    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(lmcache_adp.__file__)))
    env = {**os.environ, "PYTHONPATH": pkg_root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    gw = subprocess.Popen(gw_cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
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
        res = {"failed_futures": 0, "failed_keys": 0, "wrong_bytes": 0, "misses": 0, "errors": []}
        phases = []

        def run(kind: str, salt: int) -> None:
            pending: dict[int, tuple] = {}
            queue = list(range(a.batches))
            moved = 0
            t = time.monotonic()
            while queue or pending:
                while queue and len(pending) < a.in_flight:
                    b = queue.pop(0)
                    if kind == "store":
                        bufs = [pattern(b * 1000 + k, size, salt) for k in range(a.keys_per_batch)]
                        fid = conn.submit_batch_set(keys[b], [memoryview(x) for x in bufs])
                    else:
                        bufs = [np.zeros(size, np.uint8) for _ in range(a.keys_per_batch)]
                        fid = conn.submit_batch_get(keys[b], [memoryview(x) for x in bufs])
                    pending[fid] = (b, bufs)
                if not poller.poll(1000):
                    continue
                for fid, ok, err, per_key in conn.drain_completions():
                    b, bufs = pending.pop(fid)
                    if not ok:
                        res["failed_futures"] += 1
                        if len(res["errors"]) < 5:
                            res["errors"].append(f"{kind}: {err}")
                    for k, hit in enumerate(per_key):
                        if not hit:
                            res["failed_keys" if kind == "store" else "misses"] += 1
                            continue
                        moved += size
                        if kind == "load" and not np.array_equal(bufs[k], pattern(b * 1000 + k, size, salt)):
                            res["wrong_bytes"] += 1
            dt = time.monotonic() - t
            phases.append({"phase": kind, "seconds": round(dt, 3), "GBps": round(moved / dt / 1e9, 3)})

        for p in range(a.passes):
            run("store", p)
            run("load", p)
        conn.close()
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
