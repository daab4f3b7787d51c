# SPDX-License-Identifier: Apache-2.0
"""The smaller review findings of issue 9 (item 6): the metrics endpoint binds
127.0.0.1 by default, per-item warnings are rate-limited, a reply that fails
validation finishes each item once, and closing a CardStore waits for the
operation in progress."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lmcache_adp import ADPConnector
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway import wire
from tests.helpers import RawConnector, payload
from tests.support.gateway import TOKEN, Gateway


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on port."""
    out = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if state == "0A" and int(p, 16) == port:  # 0A: LISTEN
            out.add(addr)
    return out


@pytest.mark.parametrize("host,expected", [(None, "0100007F"), ("0.0.0.0", "00000000")])
def test_metrics_bind_loopback_unless_told(workdir, host, expected):
    port = free_port()
    extra = ("--metrics-port", str(port)) + (("--metrics-host", host) if host else ())
    gw = Gateway(workdir, extra=extra).start()
    try:
        assert listening_addresses(port) == {expected}
    finally:
        gw.stop()


def test_wrong_size_load_warnings_are_rate_limited(gateway):
    c = RawConnector(ADPConnector(gateway=gateway.unix_url, num_workers=1))
    keys = [f"sized{i}" for i in range(40)]
    assert c.set(keys, [memoryview(payload(k, 1000)) for k in keys])[0]
    outs = [bytearray(999) for _ in keys]
    ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
    assert per_key == [False] * len(keys)  # wrong size: served as misses
    c.conn.close()
    lines = [ln for ln in gateway.log().splitlines() if "holds 1000 bytes but the load buffer has 999" in ln]
    assert len(lines) == 1, lines  # 40 items, one line (the next says how many were held back)


def test_reply_failing_validation_finishes_each_item_once(workdir):
    """A gateway whose reply lies about a hit's size: the batch fails, and each
    key is counted once (before: the first key as a hit, then both again)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def recv_frame(conn):
        head = b""
        while len(head) < wire.HEADER.size:
            head += conn.recv(wire.HEADER.size - len(head))
        _, n, rid = wire.parse_header(head)
        body = b""
        while len(body) < n:
            body += conn.recv(n - len(body))
        return rid

    def fake_gateway():
        conn, _ = srv.accept()
        with conn:
            rid = recv_frame(conn)
            name = b"fake"
            hello_ok = struct.pack("<IIQQII", 0, 4096, 1 << 20, 64 << 20, len(name), 0) + name
            conn.sendall(wire.frame(wire.HELLO_OK, rid, hello_ok))
            rid = recv_frame(conn)
            # Two hits: the first as asked (4 bytes), the second claims 5 of a 4-byte buffer.
            table = struct.pack("<II", 2, 0)
            table += struct.pack("<BBHIQ", 0, 0, 0, 0, 4) + struct.pack("<BBHIQ", 0, 0, 0, 0, 5)
            conn.sendall(wire.frame(wire.BATCH_REPLY, rid, table + b"abcd" + b"efghi"))
            time.sleep(1)

    t = threading.Thread(target=fake_gateway, daemon=True)
    t.start()
    token_file = f"{workdir}/token"
    with open(token_file, "w") as f:
        f.write(TOKEN)
    conn = ADPConnector(gateway=f"tcp://127.0.0.1:{port}", token_file=token_file, num_workers=1, timeout_ms=5000)
    c = RawConnector(conn)
    outs = [bytearray(4), bytearray(4)]
    ok, err, per_key = c.get(["k0", "k1"], [memoryview(o) for o in outs])
    assert not ok and per_key == [False, False], err
    st = conn.stats()
    assert st["hits"] + st["misses"] == 2, st
    conn.close()
    t.join(timeout=5)
    srv.close()


def test_card_store_close_waits_for_the_operation_in_progress(tmp_path):
    """close() from another thread while verify() runs: close waits for it
    (before: it freed the store under the running verify). Run in a child,
    so a crash is a failure, not the end of the test run."""
    script = textwrap.dedent(f"""
        import threading, time
        from lmcache_adp import CardStore
        store = CardStore({str(tmp_path / "card.img")!r}, create_bytes=64 << 20)
        for n in range(20):
            store.put(f"k{{n}}", bytes(range(256)) * 256)
        closed = threading.Event()

        def closer():
            store.close()
            closed.set()

        seen = []

        def progress(done, total):
            if not seen:
                threading.Thread(target=closer).start()
                time.sleep(0.5)  # close() has had all the time it needs to free the store
                seen.append(closed.is_set())

        report = store.verify(progress=progress)
        assert seen == [False], "close() returned while verify was running"
        assert closed.wait(10) and report["checked"] == 20, report
        try:
            store.get("k0")
            raise AssertionError("get after close")
        except RuntimeError as e:
            assert "closed" in str(e)
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def test_a_closed_connection_is_uncounted_only_once_its_resources_are_back(gateway):
    """Review r14a N7 (after e58a523, which did it for the store buffer and `processes`): a connection ends by
    giving back its segments, ring, store buffer and process memory, then stops being counted in `clients`, so a
    stats reader that sees its count drop sees those back too (they were given back after `clients` dropped)."""
    conn = ADPConnector(gateway=gateway.unix_url, num_workers=1, timeout_ms=10000)
    c = RawConnector(conn)
    try:
        assert c.set(["uncounted"], [memoryview(payload("uncounted", 1 << 20))])[0]
        st = read_gateway_stats(gateway.unix_url)
        assert st["clients"] == 1 and st["ring_bytes"] > 0, st  # the connector's (this reader's, a status query: not)
    finally:
        conn.close()
    st = {}

    def no_client_left():
        st.update(read_gateway_stats(gateway.unix_url))
        return st["clients"] == 0

    deadline = time.monotonic() + 10
    while not no_client_left():
        assert time.monotonic() < deadline, st
        time.sleep(0.4)  # a new stats connection each time: one at a time
    held = {k: st[k] for k in ("ring_bytes", "segments", "processes", "store_buffer_bytes")}
    assert held == dict.fromkeys(held, 0), st
