#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The gateway's poll() calls per request in a small-batch loop, and the loop's time per request.

One gateway (--request-spin-us 10000; ADP_TEST_GATEWAY_CPUS and ADP_TEST_LOADAVG_FILE make its spin rule pass on a
loaded host) and one connector (one worker) storing and loading 2 objects of --size bytes a batch, back to back.
Phase 1 times --rounds rounds with nothing attached. Phase 2 attaches `strace -f -e trace=poll` to the gateway
for --rounds rounds and counts its poll() calls by timeout: 0 (the request spin's own polls) or not (a wait:
await_frame, the loader's and the store buffers' idle checks), against the requests served and the spins that
caught their request (batch_spin_hits). review32b F1: before session 33 a request the spin caught still cost one
waiting poll (await_frame's) before its read; from then on none.

    cd TREE && flock /work/bench.lock env PYTHONPATH=. python PATH/request_polls.py [--rounds 2000] [--size 4096]

It measures TREE's lmcache_adp (the gateway runs the package this process imported).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time

from lmcache_adp import ADPConnector
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.helpers import RawConnector
from tests.support.gateway import Gateway

POLL = re.compile(r"^\d+\s+poll\(\[\{fd=\d+, events=[^}]*\}\], 1, (-?\d+)\)")


def rounds(c: RawConnector, bufs: list[bytearray], prefix: str, n: int) -> float:
    """n rounds (a store and a load of the 2 buffers each); the seconds they took."""
    t0 = time.perf_counter()
    for r in range(n):
        keys = [f"{prefix}@{r}@{i}" for i in range(len(bufs))]
        assert c.set(keys, bufs)[0]
        ok, _, per_key = c.get(keys, bufs)
        assert ok and all(per_key)
    return time.perf_counter() - t0


def counters(gw: Gateway) -> dict[str, int]:
    st = read_gateway_stats(gw.unix_url)
    return {k: st[k] for k in ("batch_puts", "batch_gets", "batch_spins", "batch_spin_hits")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="adppolls-", dir="/dev/shm")
    loadavg = os.path.join(d, "loadavg")
    with open(loadavg, "w") as f:
        f.write("0.00 0.00 0.00 0/1234 5678\n")
    gw = Gateway(d, extra=("--request-spin-us", "10000")).start(
        env={"ADP_TEST_GATEWAY_CPUS": 1000, "ADP_TEST_LOADAVG_FILE": loadavg}
    )
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=30000))
    bufs = [bytearray(os.urandom(args.size)) for _ in range(2)]
    try:
        rounds(c, bufs, "warm", 50)
        secs = rounds(c, bufs, "timed", args.rounds)
        print(f"untraced: {args.rounds * 2} requests in {secs:.3f} s: {secs / (args.rounds * 2) * 1e6:.1f} us each")
        log = os.path.join(d, "strace.log")
        tracer = subprocess.Popen(
            ["strace", "-f", "-qq", "-e", "trace=poll", "-o", log, "-p", str(gw.proc.pid)], stderr=subprocess.PIPE
        )
        time.sleep(1.0)  # strace attached to every thread
        before = counters(gw)
        rounds(c, bufs, "traced", args.rounds)
        time.sleep(0.1)  # the last answer's spin ends (10 ms)
        after = counters(gw)
        tracer.terminate()
        tracer.wait()
        delta = {k: after[k] - before[k] for k in after}
        zero = waits = 0
        by_timeout: dict[int, int] = {}
        with open(log) as f:
            for line in f:
                m = POLL.match(line)
                if m:
                    ms = int(m.group(1))
                    by_timeout[ms] = by_timeout.get(ms, 0) + 1
                    if ms == 0:
                        zero += 1
                    else:
                        waits += 1
        # The status queries (counters()) add a few polls of their own on their connection: negligible here.
        requests = delta["batch_puts"] + delta["batch_gets"]
        print(f"traced: {delta}")
        print(
            f"waiting polls (timeout != 0): {waits}, {waits / requests:.3f} a request; spin hits "
            f"{delta['batch_spin_hits']} of {requests} requests; "
            f"waiting polls per request the spin did not catch: {waits / max(1, requests - delta['batch_spin_hits']):.3f}"
        )
        print(f"spin polls (timeout 0): {zero}; polls by timeout (ms): {dict(sorted(by_timeout.items()))}")
    finally:
        c.conn.close()
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
