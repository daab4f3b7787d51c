# SPDX-License-Identifier: Apache-2.0
"""Connector only (no LMCache), disk: a new 4 GiB card image, allocated or sparse (card_sparse), first filled
with 2 GiB of OBJ-byte objects by 4 workers (rounds of 4 batches of 32 keys in flight, as bench_l2), then every
object loaded back the same way; store and load MiB/s, the image's extent count (filefrag) after the fill.
Alternating kinds, order swapped every round. PROBE_SETTLE=S: sync and wait S seconds between the fill and
the loads. Run from the repository root under flock /work/bench.lock."""

import os
import select
import subprocess
import sys
import time

import numpy as np

from lmcache_adp import ADPConnector

OBJ = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 10
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
D = "/var/tmp/prealloc-probe"
TOTAL, BATCH, INFLIGHT = 2 << 30, 32, 4
os.makedirs(D, exist_ok=True)


def aligned(n):
    raw = np.empty(n + 4096, dtype=np.uint8)
    off = (-raw.ctypes.data) % 4096
    return raw[off : off + n]


bufs = [aligned(OBJ) for _ in range(BATCH * INFLIGHT)]
for i, b in enumerate(bufs):
    b[:] = i % 251


def drain(conn, fids):
    poller = select.poll()
    poller.register(conn.event_fd(), select.POLLIN)
    left, ok = set(fids), True
    while left:
        poller.poll(1000)
        for c in conn.drain_completions():
            left.discard(c[0])
            ok &= bool(c[1]) and all(c[3])
    return ok


def phase(conn, op, n):
    t0, ok = time.perf_counter(), True
    for r in range(0, n, BATCH * INFLIGHT):
        fids = []
        for j in range(INFLIGHT):
            keys = [f"k{r + j * BATCH + i}" for i in range(BATCH)]
            bb = bufs[j * BATCH : (j + 1) * BATCH]
            fids.append(conn.submit_batch_set(keys, bb) if op == "store" else conn.submit_batch_get(keys, bb))
        ok &= drain(conn, fids)
    return n * OBJ / (1 << 20) / (time.perf_counter() - t0), ok


n = TOTAL // OBJ
for rnd in range(1, ROUNDS + 1):
    for kind in ("allocated", "sparse") if rnd % 2 else ("sparse", "allocated"):
        path = f"{D}/card-{kind}.img"
        conn = ADPConnector(card=path, card_size_gb=4, num_workers=4, card_sparse=kind == "sparse")
        st, ok1 = phase(conn, "store", n)
        frag = subprocess.run(["filefrag", path], capture_output=True, text=True).stdout.split(": ")[-1].strip()
        if os.environ.get("PROBE_SETTLE"):  # sync, then wait: no metadata writeback left from the stores
            os.sync()
            time.sleep(float(os.environ["PROBE_SETTLE"]))
        ld, ok2 = phase(conn, "load", n)
        conn.close()
        os.unlink(path)
        print(f"round {rnd} {OBJ >> 10} KiB {kind:9s}: store {st:6.0f} MiB/s, load {ld:6.0f} MiB/s, {frag}, "
              f"ok {ok1 and ok2}, load avg {os.getloadavg()[0]:.2f}", flush=True)
os.rmdir(D)
