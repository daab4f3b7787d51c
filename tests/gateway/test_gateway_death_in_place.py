# SPDX-License-Identifier: Apache-2.0
"""A gateway that dies while it writes a load into LMCache's memory in place (a segment: docs/protocol.md, "The
load lease"), seen from a connector in another PID namespace (the Dockerfile's deployment: separate containers
sharing /dev/shm and the socket, no shared PID namespace). review33b F4: SO_PEERCRED gives such a connector pid 0
for the gateway, so the revoke of a lease the dead gateway left WRITING could never tell it gone and waited
forever; it now watches a pidfd of the gateway (SO_PEERPIDFD), and where the kernel has none (before Linux 6.5;
ADP_TEST_NO_PEER_PIDFD=1 stands in for one) such a connection loads through the ring instead."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

from lmcache_adp.gateway_stats import read_gateway_stats
from tests.support.gateway import temp_gateway

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNSHARE = ["unshare", "--pid", "--fork", "--kill-child"]


def _own_pid_namespace_or_skip() -> None:
    """Skips where this process may not make a PID namespace (unshare --pid needs CAP_SYS_ADMIN, or user
    namespaces); CI runs as root, where it may."""
    try:
        r = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here: a PID namespace of the client's own cannot be made")
    if r.returncode != 0:
        pytest.skip(f"`unshare --pid` is not permitted here ({r.stderr.strip()}): the client cannot get a PID "
                    "namespace of its own")  # fmt: skip


def _client(gw, size: int, path: str, own_namespace: bool, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        (UNSHARE if own_namespace else [])
        + [sys.executable, "-m", "tests.gateway.gateway_death_client", gw.unix_url, str(size), path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip


def _lease_word(pid: int) -> int | None:
    """The load lease (the ring's first 8 bytes) as the stopped gateway maps it, or None without a ring."""
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if "memfd:lmcache-adp-ring" in line:
                start = int(line.split("-", 1)[0], 16)
                with open(f"/proc/{pid}/mem", "rb") as mem:
                    mem.seek(start)
                    return struct.unpack("<Q", mem.read(8))[0]
    return None


def _loads_ok(client: subprocess.Popen, count: int) -> list[str]:
    """The client's lines until `count` loads hit."""
    lines, loads = [], 0
    while loads < count:
        line = client.stdout.readline()
        assert line, f"the client ended before its loads: {lines}"
        lines.append(line)
        loads += line.startswith("load ok=True hit=[True]")
    return lines


@pytest.mark.parametrize("pid_namespace", ["own", "the gateway's"])
def test_a_gateway_killed_mid_write_releases_the_load_in_flight(pid_namespace):
    """review33b F4: the gateway is stopped until its lease word reads WRITING (an object going into the client's
    segment), then killed: the load in flight must complete (failed) within its 3 s timeout plus a margin. On
    c988e8e the client in its own PID namespace (gateway pid 0) never completed it: its worker slept in
    RemoteSession::revoke_lease's 50 us loop for good. In the gateway's namespace (the control) the revoke found
    the killed gateway a zombie, and now finds its pidfd readable."""
    if pid_namespace == "own":
        _own_pid_namespace_or_skip()
    size = 64 << 20
    path = f"/dev/shm/adp-death-in-place-{os.getpid()}-{time.monotonic_ns()}"
    with temp_gateway(card_size_gb=1) as gw:
        client = _client(gw, size, path, pid_namespace == "own")
        try:
            _loads_ok(client, 3)
            assert read_gateway_stats(gw.unix_url)["segment_loads"] > 0, "the loads did not go into the segment"
            killed = False
            for _ in range(400):
                gw.pause()
                word = _lease_word(gw.proc.pid)
                if word is not None and word & 3 == 2:  # WRITING: an object going into the client's segment
                    gw.proc.send_signal(signal.SIGKILL)
                    killed = True
                    break
                gw.resume()
                time.sleep(0.002)
            assert killed, "never caught the gateway writing into the segment"
            client.stdin.close()
            done = []
            reader = threading.Thread(target=lambda: done.extend(client.stdout.readlines()), daemon=True)
            reader.start()
            reader.join(15)
            assert any(line.startswith("load ok=False") for line in done), (
                f"the load in flight when the gateway died did not complete in 15 s (timeout 3 s): {done}"
            )
        finally:
            client.kill()
            client.wait()
            if os.path.exists(path):
                os.unlink(path)


def test_without_a_pidfd_a_gateway_whose_pid_is_not_visible_gets_no_in_place_loads():
    """review33b F4's fallback: on a kernel without SO_PEERPIDFD (ADP_TEST_NO_PEER_PIDFD=1) a connector that
    cannot see the gateway's pid has no way to tell it dead while it holds a lease WRITING (the socket's hang-up
    does not prove that no byte is still coming: a stopping gateway shuts its connections down while a handler
    may still be copying). Such a connection takes no segments: its loads go through the ring, and the connector
    says so once at WARNING."""
    _own_pid_namespace_or_skip()
    size = 4 << 20
    path = f"/dev/shm/adp-death-no-pidfd-{os.getpid()}-{time.monotonic_ns()}"
    with temp_gateway() as gw:
        client = _client(gw, size, path, True, {"ADP_TEST_NO_PEER_PIDFD": "1"})
        try:
            lines = _loads_ok(client, 3)
            st = read_gateway_stats(gw.unix_url)
            assert st["segment_loads"] == 0, f"a connection that cannot watch its gateway loaded in place: {st}"
            client.stdin.close()
            lines += client.stdout.readlines()
            warned = [line for line in lines if "the gateway's process cannot be watched from here" in line]
            assert len(warned) == 1, "".join(lines)
        finally:
            client.kill()
            client.wait()
            if os.path.exists(path):
                os.unlink(path)
