# SPDX-License-Identifier: Apache-2.0
"""The plugin's native threads carry names (top -H, ps -L, perf, py-spy show
them), so an operator profiling LMCache's MP server can tell the plugin's
workers from torch's threads. Without names every one of them is "python" or
"lmcache"."""

from __future__ import annotations

import os
import tempfile
import time

from lmcache_adp import ADPConnector
from tests.helpers import RawConnector
from tests.support.gateway import Gateway


def thread_names(pid: int | str = "self") -> list[str]:
    task = f"/proc/{pid}/task"
    names = []
    for tid in os.listdir(task):
        try:
            with open(f"{task}/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread exited meanwhile
            pass
    return names


def names_once_started(want, pid: int | str = "self", timeout: float = 10.0) -> list[str]:
    """The thread names, once want(names) holds: a thread names itself when it starts running."""
    deadline = time.monotonic() + timeout
    while not want(names := thread_names(pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return names


def test_embedded_connector_threads_are_named(card):
    c = ADPConnector(card=card, card_size_gb=0.0625, num_workers=3)
    try:
        # Each worker names itself when it runs, in no set order: wait for all three.
        names = names_once_started(lambda n: "adp-deadline" in n and all(f"adp-worker-{i}" in n for i in range(3)))
        assert sorted(n for n in names if n.startswith("adp-worker")) == [
            "adp-worker-0",
            "adp-worker-1",
            "adp-worker-2",
        ], names
        assert names.count("adp-deadline") == 1, names
    finally:
        c.close()
    assert not [n for n in thread_names() if n.startswith("adp-")], "threads left after close()"


def test_gateway_threads_are_named():
    with tempfile.TemporaryDirectory(prefix="adpgw-", dir="/tmp") as workdir:  # short: a socket path
        gw = Gateway(workdir).start()
        try:
            pid = gw.proc.pid
            names = names_once_started(lambda n: "adp-gw-accept" in n, pid)
            assert "adp-gw-accept" in names, names
            c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1))
            try:
                assert c.exists(["m@00000000@0@1"])[0]  # a round trip: the connection is served
                names = names_once_started(lambda n: any(x.startswith("adp-conn-") for x in n), pid)
                assert any(x.startswith("adp-conn-") for x in names), names
            finally:
                c.conn.close()
        finally:
            gw.kill()
