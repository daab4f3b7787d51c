# SPDX-License-Identifier: Apache-2.0
"""The gateway under load through large rings (issue 9, item 1): many workers,
a 1 GiB ring each, 32 MiB objects, several batches in flight, stores then
loads, every byte checked. On main before the fix, setting up (populating)
each 1 GiB ring cost seconds inside the first request's deadline, and again
after every reconnect: futures failed with "gateway did not answer in time".
The 16-core version of this run is benchmarks/gateway_load.py."""

from __future__ import annotations

import select
import shutil
import tempfile
import time

import numpy as np
import pytest

from lmcache_adp import ADPConnector
from tests.support.gateway import Gateway

MIB = 1 << 20
WORKERS, RING_MB, OBJECT_MB = 8, 1024, 32
KEYS_PER_BATCH, BATCHES, IN_FLIGHT, PASSES = 8, 4, 4, 2


def pattern(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=OBJECT_MB * MIB, dtype=np.uint8)


@pytest.fixture
def shm_workdir():
    # A tmpfs card, as in the measurement: the card is never the bottleneck.
    d = tempfile.mkdtemp(prefix="adpld-", dir="/dev/shm")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_phase(conn, poller, kind: str, keys, salt: int, tally: dict) -> None:
    pending: dict[int, tuple] = {}
    queue = list(range(BATCHES))
    deadline = time.monotonic() + 300
    while queue or pending:
        assert time.monotonic() < deadline, "futures did not complete"
        while queue and len(pending) < IN_FLIGHT:
            b = queue.pop(0)
            if kind == "store":
                bufs = [pattern(salt * 10000 + b * 100 + k) for k in range(KEYS_PER_BATCH)]
                fid = conn.submit_batch_set(keys[b], [memoryview(x) for x in bufs])
            else:
                bufs = [np.zeros(OBJECT_MB * MIB, np.uint8) for _ in range(KEYS_PER_BATCH)]
                fid = conn.submit_batch_get(keys[b], [memoryview(x) for x in bufs])
            pending[fid] = (b, bufs)
        if not poller.poll(500):
            continue
        for fid, ok, err, per_key in conn.drain_completions():
            b, bufs = pending.pop(fid)
            if not ok:
                tally["failed"].append(f"{kind}: {err}")
            for k, hit in enumerate(per_key):
                if kind == "load" and hit:
                    tally["checked"] += 1
                    if not np.array_equal(bufs[k], pattern(salt * 10000 + b * 100 + k)):
                        tally["wrong"] += 1


def test_large_rings_many_workers_no_failed_futures(shm_workdir):
    gw = Gateway(shm_workdir, card_size_gb=4, extra=("--io-contexts", "4")).start()
    conn = ADPConnector(gateway=gw.unix_url, num_workers=WORKERS, ring_mb=RING_MB, timeout_ms=10000)
    poller = select.poll()
    poller.register(conn.event_fd(), select.POLLIN)
    keys = [[f"load@{b:04x}@{k:04x}" for k in range(KEYS_PER_BATCH)] for b in range(BATCHES)]
    tally = {"failed": [], "wrong": 0, "checked": 0}
    try:
        for p in range(PASSES):
            run_phase(conn, poller, "store", keys, p, tally)
            run_phase(conn, poller, "load", keys, p, tally)
    finally:
        conn.close()
        gw.stop()
    assert tally["failed"] == [], tally["failed"][:5]
    assert tally["wrong"] == 0
    # Every key stored is loaded back, byte-exact, in every pass.
    assert tally["checked"] == PASSES * BATCHES * KEYS_PER_BATCH
    assert "handshake timeout" not in gw.all_logs()
