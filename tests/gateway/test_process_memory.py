# SPDX-License-Identifier: Apache-2.0
"""Loads straight into the client's process memory (protocol r5, docs/protocol.md
"Process memory"): a connector whose load buffers are anonymous memory (LMCache's
default L1) has the gateway write the card into them with process_vm_writev, one
copy, no ring. The handshake's checks (the pid the kernel names, a probe of the
client's memory) and their refusals, which keep the ring; an r4-style client; an
address the client does not have; the load lease at the deadline; a gateway
killed mid-load; a damaged object."""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from lmcache_adp import ADPConnector
from lmcache_adp._native import (
    FEATURE_PROCESS_LOADS,
    FEATURE_PROCESS_STORES,
    FEATURE_RING,
    FEATURE_RING_PROGRESS,
    FRAME_TYPES,
    PROCESS_SEGMENT,
)
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway import wire
from tests.helpers import RawConnector, corrupt, eventually, payload
from tests.support.gateway import Gateway, temp_gateway

MIB = 1 << 20
SIZE = 3 * MIB + 100  # several pieces and a partial one
PIECE = 256 << 10  # the gateway's bounce pieces (CardStore kBouncePieceBytes)
REGISTER, PROCESS_OK = FRAME_TYPES["REGISTER_PROCESS"], FRAME_TYPES["PROCESS_OK"]
CONTROL = 4096  # the ring's control page
LEASE_OPEN = 1  # the load lease's state in the page's first 8 bytes: (request_id << 2) | state
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def gateways():
    """gateways(memory=True, env=None, **Gateway's keywords): a started gateway on a tmpfs card (pieces straight
    from its mapping) or, memory=False, on /tmp (read into staging, checked, then written out), with `env` (test
    hooks) for its first start only (tests.support.gateway.temp_gateway); killed, if still running, and its
    directory removed when the test ends, after the test's own finally blocks (which close its clients)."""
    with contextlib.ExitStack() as stack:
        yield lambda memory=True, env=None, **kw: stack.enter_context(temp_gateway(memory, env, **kw))


def write_delay(ms: int) -> dict:
    """The hook that has a gateway sleep `ms` before each object it writes into a client (outside the lease)."""
    return {"ADP_TEST_SEGMENT_WRITE_DELAY_MS": ms}


def stats(gw: Gateway) -> dict:
    return read_gateway_stats(gw.unix_url)


def store(gw: Gateway, keys: list[str], size: int = SIZE) -> None:
    w = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=20000, process_memory=False))
    assert w.set(keys, [memoryview(payload(k, size)) for k in keys])[0]
    w.conn.close()


class ProcessClient(wire.RingClient):
    """A hand-driven ring connection that may register this test process's memory."""

    def __init__(self, gw: Gateway, features: int = FEATURE_RING | FEATURE_PROCESS_LOADS, ring_bytes: int = 4 * MIB):
        super().__init__(gw.socket, features, ring_bytes)

    def register(self, pid: int | None = None, probe_addr: int | None = None, probe: bytes | None = None):
        """Sends RegisterProcess (by default this process, a probe it really holds); returns (features, reason)."""
        self.probe = ctypes.create_string_buffer(os.urandom(16), 16)
        addr = ctypes.addressof(self.probe) if probe_addr is None else probe_addr
        probe = self.probe.raw if probe is None else probe
        body = struct.pack("<IIQ", os.getpid() if pid is None else pid, len(probe), addr) + probe
        self.send(REGISTER, body)
        ftype, body = self.recv()
        assert ftype == PROCESS_OK, (ftype, body)
        features, n, _ = struct.unpack_from("<IHH", body)
        self.process_ok_tail = body[8 + n :]  # r6: the store limit, where Hello asked for it
        return features, body[8 : 8 + n].decode()

    def get(self, keys: list[bytes], sizes: list[int], addrs: list[int]) -> list[tuple[int, bytes]]:
        """A get of process items under an open load lease; the (status, message) of each."""
        return self.batch(wire.GET, keys, sizes, addrs)

    def batch(
        self, op: int, keys: list[bytes], sizes: list[int], addrs: list[int], timeout_ms: int = 5000
    ) -> list[tuple[int, bytes]]:
        """A batch of process items under an open lease; the (status, message) of each."""
        self.map[0:8] = struct.pack("<Q", (self.rid + 1) << 2 | LEASE_OPEN)
        segments = [PROCESS_SEGMENT] * len(keys)
        self.send(wire.BATCH, wire.batch(op, keys, sizes, addrs, segments=segments, timeout_ms=timeout_ms))
        ftype, body = self.recv()
        assert ftype == wire.BATCH_REPLY, (ftype, body)
        count = struct.unpack_from("<I", body)[0]
        items = [struct.unpack_from("<BBHIQ", body, 8 + 16 * i) for i in range(count)]
        out, at = [], 8 + 16 * count
        for status, _, n, _, _ in items:
            out.append((status, body[at : at + n]))
            at += n
        return out


def test_loads_land_through_process_memory_and_the_ring_carries_none(card_gateway):
    gw = card_gateway
    keys = [f"pm@{i}" for i in range(8)]
    store(gw, keys)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=20000))
    try:
        outs = [bytearray(b"\x5a" * SIZE) for _ in range(len(keys) + 1)]
        ok, _, per_key = c.get(keys + ["pm@missing"], [memoryview(o) for o in outs])
        assert per_key == [True] * len(keys) + [False]
        assert [bytes(o) for o in outs[:-1]] == [payload(k, SIZE) for k in keys]
        assert bytes(outs[-1]) == b"\x5a" * SIZE, "a miss must leave its buffer untouched"
        st = stats(gw)
        # Every hit was written into this process by the gateway: none went through a ring.
        assert st["process_loads"] == len(keys), st
        assert st["ring_piece_loads"] == 0, st
        assert st["processes"] == 2 and st["process_refusals"] == 0, st
        assert c.conn.stats()["process_loads"] == len(keys)
    finally:
        c.conn.close()


@pytest.mark.parametrize(("cpu_max", "cpus"), [("100000 100000", 1), ("250000 100000", 3), ("max 100000", None)])
def test_the_piece_helpers_default_to_the_cpus_a_containers_quota_allows(tmp_path, cpu_max, cpus):
    """--process-write-threads by default: one per CPU the gateway may use, sched_getaffinity's count or the
    cgroup's CPU quota (cpu.max "QUOTA PERIOD", rounded up) where fewer (review r13 S2); ADP_TEST_CPU_MAX_FILE
    names the cpu.max read. "max" sets no quota: the affinity's count."""
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    affinity = len(os.sched_getaffinity(0))
    with temp_gateway(env={"ADP_TEST_CPU_MAX_FILE": tmp_path / "cpu.max"}) as gw:
        assert stats(gw)["process_write_threads"] == min(affinity, cpus or affinity)


@pytest.mark.parametrize("card", ["tmpfs", "disk"])
def test_pieces_written_by_helper_threads_land_right(gateways, card):
    """A gateway with two piece helpers (--process-write-threads 2): one object's
    pieces go out on the connection's thread and on helpers at once, in any
    order, each from its own bounce buffer; every byte lands where it belongs,
    the CRC joined over the pieces passes (a hit), a miss leaves its buffer
    untouched, and the stats show the helpers and the pieces they wrote."""
    gw = gateways(card == "tmpfs", extra=("--process-write-threads", "2"))
    size = 8 * MIB + 4096 + 3  # 33 pieces, the last of 4099 bytes
    keys = [f"helpers@{i}" for i in range(8)]
    store(gw, keys, size)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
    try:
        for _ in range(3):
            outs = [bytearray(b"\x5a" * size) for _ in range(len(keys) + 1)]
            ok, _, per_key = c.get(keys + ["helpers@missing"], [memoryview(o) for o in outs])
            assert per_key == [True] * len(keys) + [False]
            assert [bytes(o) for o in outs[:-1]] == [payload(k, size) for k in keys]
            assert bytes(outs[-1]) == b"\x5a" * size, "a miss must leave its buffer untouched"
    finally:
        c.conn.close()
    st = stats(gw)
    assert st["process_loads"] == 3 * len(keys), st
    assert st["process_write_threads"] == 2, st
    assert st["process_helper_pieces"] > 0, st
    assert st["checksum_failures"] == 0, st


@pytest.mark.parametrize("idle_ms", [None, 600000])
def test_a_connection_counts_as_loading_until_it_idles(gateways, idle_ms):
    """The piece helpers an object may take are CPUs / (connections loading) - 1;
    a connection counts as loading from its first process load until it waits
    20 ms for its next request, not only while a batch runs (counted per batch,
    16 connections on 16 CPUs dipped below 16 between batches, and helpers took
    CPUs that were not spare). With the wait stretched to 10 minutes
    (ADP_TEST_LOADER_IDLE_MS) the connection is still counted after its batch
    answered; with the default 20 ms it is not, soon after; a connection that
    never loaded is not counted at all (process_piece_callers)."""
    hooks = {"ADP_TEST_LOADER_IDLE_MS": idle_ms} if idle_ms else None
    gw = gateways(env=hooks, extra=("--process-write-threads", "2"))
    a, b = ProcessClient(gw), ProcessClient(gw)
    try:
        store(gw, ["callers@a"])
        assert a.register() == (FEATURE_PROCESS_LOADS, "")
        assert b.register() == (FEATURE_PROCESS_LOADS, "")
        assert stats(gw)["process_piece_callers"] == 0
        buf = ctypes.create_string_buffer(SIZE)
        assert a.get([b"callers@a"], [SIZE], [ctypes.addressof(buf)]) == [(0, b"")]
        assert buf.raw == payload("callers@a", SIZE)
        if idle_ms:  # answered, and still counted: its next batch may come in a moment
            assert stats(gw)["process_piece_callers"] == 1
            time.sleep(0.5)
            assert stats(gw)["process_piece_callers"] == 1
        else:  # idle: no longer counted
            deadline = time.monotonic() + 10
            while stats(gw)["process_piece_callers"] != 0:
                assert time.monotonic() < deadline, "a connection idle for 10 s still counts as loading"
                time.sleep(0.05)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("value", ["4M", "64 ", "0", "6", "2048", "-4"])
def test_a_piece_size_other_than_whole_kib_from_4_to_1024_is_ignored(gateways, value):
    """ADP_BOUNCE_PIECE_KB is a whole number of KiB, a multiple of 4 from 4 to 1024; anything else (a
    unit or a space after the number, 0, not a multiple of 4, past 1 MiB, a sign) is ignored with a
    warning, and an object goes out in the default 256 KiB pieces (counted by ADP_LOAD_PROFILE=1).
    Until session nine "4M" and "64 " were read as 4 and 64 KiB pieces (the number's digits only)."""
    gw = gateways(env={"ADP_LOAD_PROFILE": 1, "ADP_BOUNCE_PIECE_KB": value}, extra=("--process-write-threads", "0"))
    store(gw, ["piece-kb"])
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
    try:
        out = bytearray(SIZE)
        assert c.get(["piece-kb"], [memoryview(out)])[2] == [True]
        assert bytes(out) == payload("piece-kb", SIZE)
    finally:
        c.conn.close()
    assert stats(gw)["load_profile_piece_n"] == -(-SIZE // PIECE)
    assert f"ADP_BOUNCE_PIECE_KB={value} is not" in gw.log()


@pytest.mark.parametrize("piece_kb", [None, 1024])
def test_load_profile_counts_every_step_of_every_piece(gateways, piece_kb):
    """ADP_LOAD_PROFILE=1 (benchmarks/README.md, "Session eight: loads"): the
    gateway's per-step sums of its process loads count each object once (in
    every per-object step: the header's copy and check are one step, timed
    once since session nine) and each of its pieces once in every per-piece step (pin, copy, unpin, sink,
    liveness, write; the lease twice: join and leave), a batch once, and time
    every step; off (the default), the stats carry none of them. The pieces
    are 256 KiB; with ADP_BOUNCE_PIECE_KB=1024 and no piece helpers, 1 MiB
    ("Session eight: loads, larger pieces")."""
    hooks = {"ADP_LOAD_PROFILE": 1} | ({"ADP_BOUNCE_PIECE_KB": piece_kb} if piece_kb else {})
    gw = gateways(env=hooks, extra=("--process-write-threads", "0"))
    keys = [f"prof@{i}" for i in range(4)]
    store(gw, keys)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
    try:
        for _ in range(2):
            outs = [bytearray(SIZE) for _ in keys]
            assert c.get(keys, [memoryview(o) for o in outs])[2] == [True] * len(keys)
            assert [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
    finally:
        c.conn.close()
    st = stats(gw)
    piece = (piece_kb << 10) if piece_kb else PIECE
    objects, pieces = 2 * len(keys), 2 * len(keys) * -(-SIZE // piece)
    n = {k[len("load_profile_") : -2]: v for k, v in st.items() if k.startswith("load_profile_") and k.endswith("_n")}
    assert n["batch"] == 2 and n["object"] == n["lookup"] == n["combine"] == n["run"] == objects, n
    assert n["index"] == n["first_look"] == n["header"] == objects, n
    for step in ("piece", "pin", "copy", "unpin", "sink", "alive", "write"):
        assert n[step] == pieces, (step, n)
    assert n["lease"] == 2 * pieces, n
    for step, count in n.items():
        assert (st[f"load_profile_{step}_ns"] > 0) == (count > 0), (step, st)
    gw2 = gateways()
    store(gw2, ["prof@off"])
    c = RawConnector(ADPConnector(gateway=gw2.unix_url, num_workers=1, timeout_ms=20000))
    try:
        assert c.get(["prof@off"], [memoryview(bytearray(SIZE))])[2] == [True]
    finally:
        c.conn.close()
    assert not [k for k in stats(gw2) if k.startswith("load_profile_")]


def test_option_off_keeps_the_ring(card_gateway):
    gw = card_gateway
    keys = [f"off@{i}" for i in range(4)]
    store(gw, keys)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000, process_memory=False))
    try:
        outs = [bytearray(SIZE) for _ in keys]
        ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
        assert ok and all(per_key)
        assert [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
        st = stats(gw)
        assert st["process_loads"] == 0 and st["processes"] == 0, st
        assert c.conn.stats()["process_loads"] == 0
    finally:
        c.conn.close()


def test_r4_client_is_offered_nothing_and_cannot_name_process_memory(card_gateway):
    """A client that did not ask for bits 4/5 sees neither in HelloOk, is never
    sent ProcessOk, and a process item from it (or from one that asked but did
    not register) closes that connection only."""
    gw = card_gateway
    store(gw, ["r4@a"])
    old = ProcessClient(gw, features=FEATURE_RING | FEATURE_RING_PROGRESS)
    assert old.features & (FEATURE_PROCESS_LOADS | FEATURE_PROCESS_STORES) == 0
    # It loads through the ring as before.
    old.send(wire.BATCH, wire.batch(wire.GET, [b"r4@a"], [SIZE], [CONTROL]))
    ftype, body = old.recv()
    assert ftype == wire.BATCH_REPLY and body[8] == 0
    assert old.map[CONTROL : CONTROL + SIZE] == payload("r4@a", SIZE)
    buf = ctypes.create_string_buffer(SIZE)
    old.send(wire.BATCH, wire.batch(wire.GET, [b"r4@a"], [SIZE], [ctypes.addressof(buf)], segments=[PROCESS_SEGMENT]))
    ftype, body = old.recv()
    assert ftype == wire.ERROR and b"process memory item without that feature granted" in body
    old.close()

    # Offered, not registered: the same.
    asked = ProcessClient(gw)
    assert asked.features & FEATURE_PROCESS_LOADS
    assert asked.features & FEATURE_PROCESS_STORES == 0, "stores from process memory were not asked for"
    asked.send(wire.BATCH, wire.batch(wire.GET, [b"r4@a"], [SIZE], [ctypes.addressof(buf)], segments=[PROCESS_SEGMENT]))
    ftype, body = asked.recv()
    assert ftype == wire.ERROR and b"without that feature granted" in body
    asked.close()

    # Registration without the feature offered breaks the rules.
    plain = ProcessClient(gw, features=FEATURE_RING)
    plain.send(REGISTER, struct.pack("<IIQ", os.getpid(), 16, 4096) + bytes(16))
    ftype, body = plain.recv()
    assert ftype == wire.ERROR and b"without a process-memory feature" in body
    plain.close()
    assert bytes(buf.raw) == bytes(SIZE), "nothing may land for a client without the grant"
    assert gw.proc.poll() is None


@pytest.mark.parametrize("case", ["pid", "probe bytes", "probe address"])
def test_refused_registration_keeps_the_ring(card_gateway, case):
    gw = card_gateway
    store(gw, ["ref@a"])
    c = ProcessClient(gw)
    try:
        args = {
            "pid": {"pid": os.getpid() + 1},
            "probe bytes": {"probe": os.urandom(16)},
            "probe address": {"probe_addr": 8},  # the zero page: never mapped
        }[case]
        features, reason = c.register(**args)
        assert features == 0
        assert {"pid": "the kernel says pid", "probe bytes": "other bytes", "probe address": "cannot be read"}[
            case
        ] in reason, reason
        # The connection goes on, through the ring.
        c.send(wire.BATCH, wire.batch(wire.GET, [b"ref@a"], [SIZE], [CONTROL]))
        ftype, body = c.recv()
        assert ftype == wire.BATCH_REPLY and body[8] == 0
        assert c.map[CONTROL : CONTROL + SIZE] == payload("ref@a", SIZE)
        # And a process item is still refused.
        buf = ctypes.create_string_buffer(16)
        c.send(wire.BATCH, wire.batch(wire.GET, [b"ref@a"], [16], [ctypes.addressof(buf)], segments=[PROCESS_SEGMENT]))
        assert c.recv()[0] == wire.ERROR
        st = stats(gw)
        assert st["process_refusals"] == 1 and st["processes"] == 0, st
    finally:
        c.close()
    with open(gw.log_path) as f:
        assert "process memory refused, the ring stays" in f.read()


# A connector process that loads two stored keys and reports what it got;
# PRELUDE runs first (the non-dumpable test turns the process non-dumpable).
CHILD_TEMPLATE = """
import ctypes, json, sys
from lmcache_adp import ADPConnector
from tests.helpers import RawConnector, payload
PRELUDE
url, size = sys.argv[1], int(sys.argv[2])
keys = ["KEY@0", "KEY@1"]
c = RawConnector(ADPConnector(gateway=url, num_workers=2, timeout_ms=20000))
outs = [bytearray(size) for _ in keys]
ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
good = ok and all(bytes(o) == payload(k, size) for o, k in zip(outs, keys))
print(json.dumps({"good": good, "process_loads": c.conn.stats()["process_loads"]}))
c.conn.close()
"""
CHILD = CHILD_TEMPLATE.replace("PRELUDE", "").replace("KEY", "ns")


def test_client_in_another_pid_namespace_is_refused_and_loads_through_the_ring(card_gateway):
    """A connector in its own PID namespace (a container) names itself pid 1; the
    gateway's kernel names another pid: refused, logged once, the ring serves."""
    assert os.geteuid() == 0, "this test needs root: unshare --pid makes a PID namespace only as root"
    gw = card_gateway
    store(gw, ["ns@0", "ns@1"])
    unshare = shutil.which("unshare")
    assert unshare, "util-linux unshare is needed for this test (scripts/run_tests.sh installs it)"
    refusal = refused_child_loads(gw, [unshare, "--pid", "--fork", sys.executable, "-c", CHILD])
    assert "the kernel says pid" in refusal and "INFO" in refusal


def refused_child_loads(gw: Gateway, argv: list[str]) -> str:
    """Runs a connector child (CHILD_TEMPLATE) that the gateway refuses: all its loads good, none through
    process memory, nothing registered; returns its refusal, logged once whatever the number of connections."""
    r = subprocess.run([*argv, gw.unix_url, str(SIZE)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith('{"good": true, "process_loads": 0}'), r.stdout + r.stderr
    refusals = [line for line in r.stderr.splitlines() if "does not write loads into this process's memory" in line]
    assert len(refusals) == 1, r.stderr
    st = stats(gw)
    assert st["process_refusals"] >= 1 and st["processes"] == 0 and st["process_loads"] == 0, st
    return refusals[0]


def test_unmapped_address_fails_that_item_and_the_gateway_serves_on(card_gateway):
    gw = card_gateway
    keys = [b"bad@a", b"bad@b"]
    store(gw, [k.decode() for k in keys])
    c = ProcessClient(gw)
    other = ProcessClient(gw)
    try:
        assert c.register() == (FEATURE_PROCESS_LOADS, "")
        buf = ctypes.create_string_buffer(SIZE)
        res = c.get(keys, [SIZE, SIZE], [1 << 47, ctypes.addressof(buf)])  # above user space on x86-64: never mapped
        assert res[0][0] == 2 and b"not mapped writable" in res[0][1], res
        assert res[1] == (0, b"")
        assert buf.raw == payload("bad@b", SIZE)
        # Read-only memory in the client: the same.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        ro = libc.mmap(None, SIZE, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        assert ro not in (None, ctypes.c_void_p(-1).value)
        res = c.get(keys[:1], [SIZE], [ro])
        assert res[0][0] == 2 and b"not mapped writable" in res[0][1], res
        # The connection and the others go on.
        buf2 = ctypes.create_string_buffer(SIZE)
        assert c.get(keys[:1], [SIZE], [ctypes.addressof(buf2)]) == [(0, b"")]
        assert buf2.raw == payload("bad@a", SIZE)
        assert other.register()[0] == FEATURE_PROCESS_LOADS
        buf3 = ctypes.create_string_buffer(SIZE)
        assert other.get(keys[1:], [SIZE], [ctypes.addressof(buf3)]) == [(0, b"")]
        assert buf3.raw == payload("bad@b", SIZE)
    finally:
        c.close()
        other.close()
    assert gw.proc.poll() is None


def test_nothing_written_after_the_future_failed(gateways):
    """The gateway is slow before each object (ADP_TEST_SEGMENT_WRITE_DELAY_MS):
    the load's deadline passes with objects still to write. Once the future has
    failed, the buffers do not change again: the connector revoked the load
    lease, and the gateway writes nothing under a revoked lease. The deadline
    (1.5 s) is the gateway's writing alone (connected before the load) and
    leaves the first object 1.2 s of room; the last one cannot come before
    1.8 s (six sleeps of 300 ms)."""
    gw = gateways(env=write_delay(300))
    keys = [f"late@{i}" for i in range(6)]
    store(gw, keys)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=1500))
    # Connected (and registered) before the load: a connect inside a 700 ms deadline took 350 ms on a loaded CI
    # host (session 13, test_process_stores), and the first object did not land before the deadline.
    assert eventually(lambda: c.exists(["late@warm-up"])[0]), "the gateway answers a lookup"
    outs = [bytearray(b"\x11" * SIZE) for _ in keys]
    ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
    assert not ok and per_key == [False] * len(keys)
    at_completion = [bytes(o) for o in outs]
    assert at_completion[0] == payload(keys[0], SIZE), "the first object lands before the deadline"
    assert at_completion[-1] == b"\x11" * SIZE
    time.sleep(300 * len(keys) / 1000 + 0.5)  # the gateway would have written them all by now
    assert [bytes(o) for o in outs] == at_completion, "bytes landed after the future failed"
    assert 1 <= stats(gw)["process_loads"] < len(keys)
    c.conn.close()


def test_gateway_killed_mid_load_fails_the_future_at_once(gateways):
    """The gateway dies part way through a batch it writes into the client:
    the future fails then, not at its deadline (20 s), nothing lands after it,
    and once the gateway is back the connector loads through process memory
    again."""
    gw = gateways(env=write_delay(300))
    keys = [f"dies@{i}" for i in range(6)]
    store(gw, keys)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
    outs = [bytearray(SIZE) for _ in keys]
    t0 = time.monotonic()
    fid = c.conn.submit_batch_get(keys, [memoryview(o) for o in outs])
    time.sleep(0.8)  # two objects in
    gw.kill()
    ok, err, per_key = c.wait(fid, timeout=15)
    assert not ok and per_key == [False] * len(keys)
    assert "timed out" not in err and time.monotonic() - t0 < 10, err
    gw.start()
    outs = [bytearray(SIZE) for _ in keys]
    ok, _, per_key = c.wait(c.conn.submit_batch_get(keys, [memoryview(o) for o in outs]), timeout=30)
    assert ok and all(per_key)
    assert [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
    assert stats(gw)["process_loads"] == len(keys)
    c.conn.close()


@pytest.mark.parametrize("where", ["first piece", "last piece", "header"])
def test_damaged_object_is_a_miss(card_gateway, where):
    gw = card_gateway
    keys = ["dmg@good", "dmg@bad"]
    store(gw, keys)
    at = {"first piece": 4096 + 777, "last piece": 4096 + SIZE - 5, "header": 30}[where]
    corrupt(gw.card, keys[1], at)  # a 3 MiB object on 2 MiB regions: the payload continues in another region
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
    try:
        outs = [bytearray(SIZE) for _ in keys]
        ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
        assert per_key == [True, False]
        assert bytes(outs[0]) == payload(keys[0], SIZE)
        st = stats(gw)
        assert st["checksum_failures"] == 1 and st["process_loads"] == 1, st
        if where == "header" or not gw.workdir.startswith("/dev/shm"):
            # Checked before any byte went out (a header, or a staged object).
            assert bytes(outs[1]) == bytes(SIZE)
        else:
            # docs/protocol.md, "What a failure leaves": on a memory-speed card every piece went out before the
            # CRC's verdict, so the buffer holds the object as the card holds it: the payload's byte at - 4096
            # flipped (and no other: the label is the payload's offset, across the region boundary).
            damaged = bytearray(payload(keys[1], SIZE))
            damaged[at - 4096] ^= 1
            assert bytes(outs[1]) == bytes(damaged), "not the object as the card holds it"
        assert c.exists(keys)[2] == [True, False], "a damaged object is dropped"
    finally:
        c.conn.close()


def test_damaged_object_is_dropped_on_a_memory_speed_card_with_small_load_buffers(gateways):
    """Review r8 (ccceb23): the load buffers' total (--max-store-buffer-total-mb) bounds only what a
    card that is not memory-speed reads into a connection's hold; a tmpfs card never does, so with a
    total below an object's size a damaged object is still a miss, counted once, and dropped (not
    Busy on every load and kept)."""
    gw = gateways(extra=("--max-store-buffer-total-mb", "1"))
    keys = ["small@good", "small@bad"]
    c = None
    try:
        store(gw, keys)
        corrupt(gw.card, keys[1], 4096 + 777)
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
        outs = [bytearray(SIZE) for _ in keys]
        ok, err, per_key = c.get(keys, [memoryview(o) for o in outs])
        assert per_key == [True, False], err
        assert bytes(outs[0]) == payload(keys[0], SIZE)
        st = stats(gw)
        assert st["checksum_failures"] == 1 and st["load_hold_busy"] == 0 and st["load_hold_bytes"] == 0, st
        assert c.exists(keys)[2] == [True, False], "a damaged object is dropped"
    finally:
        if c is not None:
            c.conn.close()


PR_SET_DUMPABLE = 4
# As a process that exec'd a setuid binary is: not dumpable, so nothing
# that lacks CAP_SYS_PTRACE may read or write its memory.
NON_DUMPABLE_CHILD = CHILD_TEMPLATE.replace(
    "PRELUDE", f"assert ctypes.CDLL(None, use_errno=True).prctl({PR_SET_DUMPABLE}, 0, 0, 0, 0) == 0"
).replace("KEY", "nd")


def test_non_dumpable_client_is_refused_even_by_a_root_gateway(card_gateway):
    """The suite runs as root, so the gateway holds CAP_SYS_PTRACE; it drops it
    from each thread's effective set before any process_vm_readv/writev. A
    non-dumpable client (a setuid exec looks the same to the kernel) is then
    refused with EPERM at registration, and loads through the ring."""
    assert os.geteuid() == 0, "this test needs root: it shows that a root gateway gets EPERM from the kernel"
    gw = card_gateway
    store(gw, ["nd@0", "nd@1"])
    refusal = refused_child_loads(gw, [sys.executable, "-c", NON_DUMPABLE_CHILD])
    # The refusal names this cause among EPERM's, and how to see it (review r9: the bench's non-dumpable run).
    assert "no access to the memory" in refusal and "or not dumpable: prctl PR_SET_DUMPABLE 0" in refusal, refusal
    assert re.search(r"/proc/\d+/status then owned by root\)", refusal), refusal  # whole: not clipped


def set_dumpable(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_DUMPABLE, int(on), 0, 0, 0) == 0, ctypes.get_errno()


def test_client_turned_non_dumpable_after_registering_gets_nothing_written(card_gateway):
    """Registered while dumpable, then not dumpable (as after a setuid exec by
    the same pid): its process loads fail as unavailable and not one byte is
    written; the gateway serves the others."""
    assert os.geteuid() == 0, "this test needs root: it shows that a root gateway gets EPERM from the kernel"
    gw = card_gateway
    keys = [b"nd@a", b"nd@b"]
    store(gw, [k.decode() for k in keys])
    c = ProcessClient(gw)
    try:
        assert c.register() == (FEATURE_PROCESS_LOADS, "")
        bufs = [ctypes.create_string_buffer(b"\x33" * SIZE, SIZE) for _ in keys]
        set_dumpable(False)
        try:
            res = c.get(keys, [SIZE, SIZE], [ctypes.addressof(b) for b in bufs])
        finally:
            set_dumpable(True)
        assert [r[0] for r in res] == [9, 9] and b"no access to the memory" in res[0][1], res
        assert [b.raw for b in bufs] == [b"\x33" * SIZE] * 2, "bytes landed in a process the gateway may not write"
        st = stats(gw)
        assert st["process_loads"] == 0, st
        # Dumpable again: the same connection loads, and others are served all along.
        assert c.get(keys[:1], [SIZE], [ctypes.addressof(bufs[0])]) == [(0, b"")]
        assert bufs[0].raw == payload("nd@a", SIZE)
        other = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
        out = bytearray(SIZE)
        assert other.get(["nd@b"], [memoryview(out)])[2] == [True]
        assert bytes(out) == payload("nd@b", SIZE)
        other.conn.close()
    finally:
        c.close()
    assert gw.proc.poll() is None


def colliding_keys() -> tuple[str, str]:
    """Two printable 16-byte keys with the same hash_key (MurmurHash64A with the
    card's fixed seed, src_cpp/store/card_format.cc): each 8-byte block's mix is
    invertible, so the second block of the other key is solved for."""
    mask, m = (1 << 64) - 1, 0xC6A4A7935BD1E995
    minv = pow(m, -1, 1 << 64)

    def mix(k: int) -> int:
        k = k * m & mask
        k ^= k >> 47
        return k * m & mask

    def unmix(y: int) -> int:
        x = y * minv & mask
        x ^= x >> 47
        return x * minv & mask

    h0 = 0x41445043415244 ^ (16 * m & mask)
    victim = b"collide@victim!!"
    a1, a2 = struct.unpack("<QQ", victim)
    h1a = (h0 ^ mix(a1)) * m & mask
    rng = __import__("random").Random(7)
    while True:
        b1 = bytes(rng.randrange(0x21, 0x7F) for _ in range(8))
        h1b = (h0 ^ mix(struct.unpack("<Q", b1)[0])) * m & mask
        b2 = struct.pack("<Q", unmix(h1a ^ mix(a2) ^ h1b))
        if all(0x21 <= c < 0x7F for c in b2):
            return victim.decode(), (b1 + b2).decode()


def test_colliding_key_loads_apart_from_the_victim(card_gateway):
    """A tenant crafts a key with the victim key's 64-bit hash_key and stores it.
    Until session 21 it took the victim's index entry (the victim's load then a
    miss); the index is keyed by a secret hash now, so each key loads its own
    object through process memory (and through the ring in pieces, below). The
    residual case, two keys of one index hash, is tested in
    tests/cpp/collision_load_test.cc (the full key compared before the first
    piece)."""
    gw = card_gateway
    victim, forged = colliding_keys()
    store(gw, [victim])
    store(gw, [forged])
    c = ProcessClient(gw)
    try:
        assert c.register() == (FEATURE_PROCESS_LOADS, "")
        buf = ctypes.create_string_buffer(b"\x77" * SIZE, SIZE)
        res = c.get([victim.encode()], [SIZE], [ctypes.addressof(buf)])
        assert res == [(0, b"")], "the forged key's store evicted the victim"
        assert buf.raw == payload(victim, SIZE)
        assert c.get([forged.encode()], [SIZE], [ctypes.addressof(buf)]) == [(0, b"")]
        assert buf.raw == payload(forged, SIZE)
    finally:
        c.close()


def test_colliding_key_loads_apart_through_the_ring(gateways):
    """The same through the ring in pieces (r4, memory-speed cards only): the
    victim's load publishes the victim's own bytes, the forged key's its own."""
    gw = gateways()
    victim, forged = colliding_keys()
    store(gw, [victim])
    store(gw, [forged])
    c = ProcessClient(gw, features=FEATURE_RING | FEATURE_RING_PROGRESS)
    assert c.features & FEATURE_RING_PROGRESS
    try:
        c.map[CONTROL : CONTROL + SIZE] = b"\x77" * SIZE
        c.send(wire.BATCH, wire.batch(wire.GET, [victim.encode()], [SIZE], [CONTROL]))
        ftype, body = c.recv()
        assert ftype == wire.BATCH_REPLY and body[8] == 0, body  # found: the forged store spared it
        assert c.map[CONTROL : CONTROL + SIZE] == payload(victim, SIZE)
        c.send(wire.BATCH, wire.batch(wire.GET, [forged.encode()], [SIZE], [CONTROL]))
        ftype, body = c.recv()
        assert ftype == wire.BATCH_REPLY and body[8] == 0, body
        assert c.map[CONTROL : CONTROL + SIZE] == payload(forged, SIZE)
    finally:
        c.close()


def send_until_stalled(a: ProcessClient, key: bytes, size: int, tries: int = 30):
    """Sends a's load of key (a process item, lease open) until one stalls: no
    reply within 1 s. The stall knob is taken by the first write that stalls; with
    ADP_TEST_PROCESS_WRITE_STALL_ON=helper that write must be on a piece helper,
    which may join an object only after its own thread sent every piece (a busy
    host): such loads answer whole and are sent again. Returns the stalled load's
    buffer."""
    for _ in range(tries):
        buf = ctypes.create_string_buffer(b"\x77" * size, size)
        a.map[0:8] = struct.pack("<Q", (a.rid + 1) << 2 | LEASE_OPEN)
        a.send(wire.BATCH, wire.batch(wire.GET, [key], [size], [ctypes.addressof(buf)], timeout_ms=60000,
                                      segments=[PROCESS_SEGMENT]))  # fmt: skip
        if not select.select([a.sock], [], [], 1.0)[0]:
            return buf
        ftype, body = a.recv()
        assert ftype == wire.BATCH_REPLY and body[8] == 0 and buf.raw == payload(key.decode(), size), body
    pytest.fail(f"none of {tries} loads stalled: no helper joined them")


@pytest.mark.parametrize("helpers", [0, 1])
def test_a_stalled_process_write_holds_nothing_shared(gateways, helpers):
    """One client's memory stalls the gateway's write into it (as a load buffer
    on a FUSE file it never serves would: ADP_TEST_PROCESS_WRITE_STALL_MS blocks
    the first process write past a first piece for 8 s). With a pool of one I/O
    context, and no piece helper or one (which the stall may hold), a second
    client stores and loads through the same gateway meanwhile, within its own
    3 s deadline, and eviction reclaims the region the stalled load was reading:
    the stalled connection holds no I/O context and no pin while it writes, and
    a helper it holds is no one else's wait. With no helper its load then ends at
    the next piece (the entry changed), a miss, having written only the pieces it
    had copied, which were that object's; with one, the other thread may have
    sent every other piece already (a hit) or not (a miss): either way every byte
    written is the object's."""
    extra = ("--io-contexts", "1", "--process-write-threads", str(helpers))
    # With a helper, the stall holds the pool's only one.
    gw = gateways(env=write_stall(8000, on_helper=bool(helpers)), card_size_gb=0.0625, extra=extra)
    a = ProcessClient(gw)
    size = 16 * MIB if helpers else SIZE  # time for the helper to join
    try:
        store(gw, ["stall@a"], size)
        assert a.register() == (FEATURE_PROCESS_LOADS, "")
        buf = send_until_stalled(a, b"stall@a", size)  # the gateway is in the stalled write
        b = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=3000))
        big = 4 * MIB
        keys = [f"stall@b{i}" for i in range(40)]  # 160 MiB through a 64 MiB card
        for i in range(0, len(keys), 4):
            ok, err, _ = b.set(keys[i : i + 4], [memoryview(payload(k, big)) for k in keys[i : i + 4]])
            assert ok, f"a store waited on the stalled connection: {err}"
        outs = [bytearray(big) for _ in range(4)]
        ok, err, per_key = b.get(keys[-4:], [memoryview(o) for o in outs])
        assert ok and all(per_key), err
        assert [bytes(o) for o in outs] == [payload(k, big) for k in keys[-4:]]
        assert b.exists(["stall@a"])[2] == [False], "the stalled load's region was not reclaimed"
        assert stats(gw)["evicted_regions"] >= 1
        b.conn.close()
        assert not select.select([a.sock], [], [], 0)[0], "the stalled load answered before its stall ended"
        ftype, body = a.recv()
        got, want = buf.raw, payload("stall@a", size)
        if helpers:
            assert ftype == wire.BATCH_REPLY and body[8] in (0, 1), body
            assert all(g in (w, 0x77) for g, w in zip(got, want, strict=True)), "bytes that are not the object's"
            assert body[8] == 1 or got == want
        else:
            assert ftype == wire.BATCH_REPLY and body[8] == 1, body  # a miss: evicted between its pieces
            # Its first piece, and the second it had copied before the stall, landed; nothing after them.
            written = next(i for i in range(size) if got[i] != want[i])
            assert 0 < written <= 2 * PIECE and got[written:] == b"\x77" * (size - written), written
    finally:
        a.close()


def test_connector_withdraws_the_grant_on_eperm_and_loads_through_the_ring(card_gateway, capfd):
    """A connector whose process turns non-dumpable after registering: the
    gateway answers its process items EPERM (unavailable); the connector
    withdraws the grant for that connection, logs it once, and the same loads
    go through the ring and succeed instead of failing."""
    assert os.geteuid() == 0, "this test needs root: it shows that a root gateway gets EPERM from the kernel"
    gw = card_gateway
    keys = [f"wd@{i}" for i in range(4)]
    store(gw, keys)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
    try:
        outs = [bytearray(SIZE) for _ in keys]
        assert c.get(keys[:2], [memoryview(o) for o in outs[:2]])[2] == [True, True]
        assert c.conn.stats()["process_loads"] == 2
        set_dumpable(False)
        try:
            for _ in range(2):
                outs = [bytearray(SIZE) for _ in keys]
                ok, err, per_key = c.get(keys, [memoryview(o) for o in outs])
                assert ok and per_key == [True] * len(keys), err
                assert [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
        finally:
            set_dumpable(True)
        assert c.conn.stats()["process_loads"] == 2, "no process load after the grant was withdrawn"
    finally:
        c.conn.close()
    err = capfd.readouterr().err
    withdrawn = [line for line in err.splitlines() if "lost access to this process's memory" in line]
    assert len(withdrawn) == 1 and "goes through the ring from now on" in withdrawn[0], err


def write_stall(ms: int = 3000, on_helper: bool = False) -> dict:
    """The hooks that have a gateway's first process write past an object's first piece wait `ms`
    (ADP_TEST_PROCESS_WRITE_STALL_MS), outside the lease; with on_helper, only on a helper of the piece pool."""
    return {"ADP_TEST_PROCESS_WRITE_STALL_MS": ms} | (
        {"ADP_TEST_PROCESS_WRITE_STALL_ON": "helper"} if on_helper else {}
    )


def test_no_piece_goes_out_past_the_deadline(gateways):
    """Review r7 S4/S1: the request's deadline is checked before each piece and when the lease is
    taken, not only per item, so a revoke at the client's deadline waits out only the pieces in
    flight. The write of piece 1 stalls 1.5 s (outside the lease) in a request of 300 ms: the item
    answers TimedOut, piece 0 is written and nothing after it (without the check at the lease,
    the stalled piece 1 was written after the deadline)."""
    gw = gateways(env=write_stall(1500), extra=("--process-write-threads", "0"))
    a = ProcessClient(gw)
    try:
        store(gw, ["late@a"])
        assert a.register() == (FEATURE_PROCESS_LOADS, "")
        buf = ctypes.create_string_buffer(b"\x77" * SIZE, SIZE)
        a.map[0:8] = struct.pack("<Q", (a.rid + 1) << 2 | LEASE_OPEN)
        a.send(wire.BATCH, wire.batch(wire.GET, [b"late@a"], [SIZE], [ctypes.addressof(buf)], timeout_ms=300,
                                      segments=[PROCESS_SEGMENT]))  # fmt: skip
        ftype, body = a.recv()
        assert ftype == wire.BATCH_REPLY, (ftype, body)
        assert body[8] != 0, body  # a failure, not OK or a miss
        assert b"deadline passed" in body, body
        assert buf.raw[:PIECE] == payload("late@a", SIZE)[:PIECE]
        assert buf.raw[PIECE:] == b"\x77" * (SIZE - PIECE)
    finally:
        a.close()


@pytest.mark.parametrize("helpers,piece_kb", [(0, None), (2, None), (0, 1024)])
def test_lease_revoked_in_the_middle_of_an_object(gateways, helpers, piece_kb):
    """The client revokes the load lease while the gateway is between two pieces
    of one object (one piece stalled before its write): with no piece helper the
    first piece landed (256 KiB, or 1 MiB with ADP_BOUNCE_PIECE_KB=1024); with
    helpers the other threads may have sent every other piece. Either way
    nothing lands after the revoke, not even the stalled piece, and the item
    answers TimedOut; the connection serves on. The revoke must come within the
    stall (3 s): the look at the buffer before it is numpy's, not a Python loop
    over 3 MiB (with five busy loops at nice -5 beside the other engineers' work
    that loop outlasted the stall, the load answered OK, and all three cases
    failed)."""
    hooks = write_stall() | ({"ADP_BOUNCE_PIECE_KB": piece_kb} if piece_kb else {})
    gw = gateways(env=hooks, extra=("--process-write-threads", str(helpers)))
    piece = (piece_kb << 10) if piece_kb else PIECE
    a = ProcessClient(gw)
    try:
        store(gw, ["mid@a"])
        assert a.register() == (FEATURE_PROCESS_LOADS, "")
        buf = ctypes.create_string_buffer(b"\x77" * SIZE, SIZE)
        rid = a.rid + 1
        a.map[0:8] = struct.pack("<Q", rid << 2 | LEASE_OPEN)
        a.send(wire.BATCH, wire.batch(wire.GET, [b"mid@a"], [SIZE], [ctypes.addressof(buf)], timeout_ms=60000,
                                      segments=[PROCESS_SEGMENT]))  # fmt: skip
        time.sleep(1.0)  # one piece waits before its write; the others are written
        want = payload("mid@a", SIZE)
        seen = buf.raw
        got, own = np.frombuffer(seen, np.uint8), np.frombuffer(want, np.uint8)
        assert np.all((got == own) | (got == 0x77)), "bytes that are not the object's"
        assert seen != want, "the stalled piece landed before the revoke"
        if not helpers:
            assert seen[:piece] == want[:piece] and seen[piece:] == b"\x77" * (SIZE - piece)
        a.map[0:8] = struct.pack("<Q", rid << 2 | 3)  # revoked, as the connector does at its deadline
        ftype, body = a.recv()
        assert ftype == wire.BATCH_REPLY and body[8] == 6, body  # timed out: the client gave up
        assert buf.raw == seen, "bytes landed after the lease was revoked"
        time.sleep(0.5)
        assert buf.raw == seen, "bytes landed after the reply"
        buf2 = ctypes.create_string_buffer(SIZE)
        assert a.get([b"mid@a"], [SIZE], [ctypes.addressof(buf2)]) == [(0, b"")]
        assert buf2.raw == want
    finally:
        a.close()


@pytest.mark.parametrize("helpers", [0, 1])
def test_stop_does_not_wait_for_a_stalled_load_write(gateways, helpers):
    """A load whose write into the client stalls for good (10 minutes), on the
    connection's thread or on a piece helper it waits for: SIGTERM still ends
    the gateway cleanly (exit 0, not the harness's SIGKILL after 30 s), leaving
    the stalled connection behind with a warning; the piece pool stays for the
    thread left behind, and a restart serves the object."""
    extra = ("--process-write-threads", str(helpers))
    gw = gateways(env=write_stall(600000, on_helper=bool(helpers)), extra=extra)
    size = 16 * MIB if helpers else SIZE  # time for the helper to join
    a = ProcessClient(gw)
    try:
        store(gw, ["stopl@a"], size)
        assert a.register() == (FEATURE_PROCESS_LOADS, "")
        buf = send_until_stalled(a, b"stopl@a", size)  # the gateway is in the stalled write
        assert gw.stop() == 0, gw.logs[-1]
        log = gw.logs[-1]
        assert f"stopping without client #1 (pid {os.getpid()})" in log, log
        assert a.recv() == (None, b"")  # the connection ended with the gateway
        if helpers:  # the helper's piece is the one missing
            assert buf.raw != payload("stopl@a", size)
        gw.start()
        buf2 = ctypes.create_string_buffer(size)
        b = ProcessClient(gw)
        try:
            assert b.register() == (FEATURE_PROCESS_LOADS, "")
            assert b.get([b"stopl@a"], [size], [ctypes.addressof(buf2)]) == [(0, b"")]
            assert buf2.raw == payload("stopl@a", size)
        finally:
            b.close()
    finally:
        a.close()


def test_stop_ends_a_long_process_batch_at_its_next_item(gateways):
    """Review r7 S1: a well-behaved but long batch of process items (40 objects, the gateway
    slowed to 250 ms before each) does not hold stop() until its end: SIGTERM ends it at its next
    item. The gateway exits 0, the connection closes without a reply, and the items after the stop
    are never written (without the stopping flag every one of the 40 is written first)."""
    gw = gateways(env=write_delay(250))
    n = 40
    keys = [f"long@{i}" for i in range(n)]
    a = ProcessClient(gw)
    try:
        store(gw, keys, PIECE)
        assert a.register() == (FEATURE_PROCESS_LOADS, "")
        bufs = [ctypes.create_string_buffer(b"\x77" * PIECE, PIECE) for _ in keys]
        a.map[0:8] = struct.pack("<Q", (a.rid + 1) << 2 | LEASE_OPEN)
        a.send(wire.BATCH, wire.batch(wire.GET, [k.encode() for k in keys], [PIECE] * n,
                                      [ctypes.addressof(b) for b in bufs], timeout_ms=600000,
                                      segments=[PROCESS_SEGMENT] * n))  # fmt: skip
        deadline = time.monotonic() + 30
        while bufs[0].raw != payload(keys[0], PIECE):  # the batch is under way
            assert time.monotonic() < deadline, "the batch's first item was never written"
            time.sleep(0.01)
        assert gw.stop() == 0, gw.logs[-1]
        assert a.recv() == (None, b"")  # no reply: the connection ended with the gateway
        written = [b.raw == payload(k, PIECE) for k, b in zip(keys, bufs, strict=True)]
        untouched = [b.raw == b"\x77" * PIECE for b in bufs]
        assert all(w or u for w, u in zip(written, untouched, strict=True))  # each item whole or not at all
        assert sum(written) < n, "every item was written: stop() waited for the whole batch"
        assert untouched[-1]
    finally:
        a.close()


def test_buffer_whose_tail_is_unmapped_fails_that_item(card_gateway):
    """A partial transfer: the load buffer's last page is not mapped. The item
    fails as invalid argument (not mapped writable) with the bytes before the
    hole written and nothing else; the request's other item and the
    connection go on."""
    gw = card_gateway
    store(gw, ["tail@a", "tail@b"])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    span = (SIZE + page - 1) // page * page
    base = libc.mmap(None, span, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    ctypes.memset(base, 0x77, span)
    assert libc.munmap(base + span - page, page) == 0  # the buffer's tail: gone
    c = ProcessClient(gw)
    try:
        assert c.register() == (FEATURE_PROCESS_LOADS, "")
        other = ctypes.create_string_buffer(SIZE)
        res = c.get([b"tail@a", b"tail@b"], [SIZE, SIZE], [base, ctypes.addressof(other)])
        assert res[0][0] == 2 and b"not mapped writable" in res[0][1], res
        assert res[1] == (0, b"")
        assert other.raw == payload("tail@b", SIZE)
        mapped = span - page
        assert ctypes.string_at(base, mapped) == payload("tail@a", SIZE)[:mapped]
        buf = ctypes.create_string_buffer(SIZE)
        assert c.get([b"tail@a"], [SIZE], [ctypes.addressof(buf)]) == [(0, b"")]
        assert buf.raw == payload("tail@a", SIZE)
    finally:
        c.close()
        libc.munmap(base, span - page)
    assert gw.proc.poll() is None


# Both processes below map their buffer at this address, so that a write meant for the one lands in the
# other if the gateway ever takes the pid for the process.
FIXED_AT = 0x5A5A00000000
MAP_FIXED_AT = f"""
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
MAP_FIXED_NOREPLACE = 0x100000
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE
assert libc.mmap({FIXED_AT}, {SIZE}, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0) == {FIXED_AT}
"""
# Registers, proves the grant with one load, then forks: the registered process exits and its child keeps
# the socket; on "go" the child asks for a load into the same address and says what came of it.
FORKED_CLIENT = (
    MAP_FIXED_AT
    + f"""
import json, os, struct, sys, types
sys.path.insert(0, {REPO!r})
from tests.gateway import wire
from tests.gateway.test_process_memory import FEATURE_PROCESS_LOADS, LEASE_OPEN, PROCESS_SEGMENT, ProcessClient
c = ProcessClient(types.SimpleNamespace(socket=sys.argv[1]))
assert c.register() == (FEATURE_PROCESS_LOADS, "")
assert c.get([b"fork@a"], [{SIZE}], [{FIXED_AT}]) == [(0, b"")]  # granted: it lands
ctypes.memset({FIXED_AT}, 0x33, {SIZE})
if os.fork():
    print(json.dumps({{"registered": os.getpid()}}), flush=True)
    os._exit(0)
sys.stdin.readline()
c.map[0:8] = struct.pack("<Q", (c.rid + 1) << 2 | LEASE_OPEN)
c.send(wire.BATCH, wire.batch(wire.GET, [b"fork@a"], [{SIZE}], [{FIXED_AT}], segments=[PROCESS_SEGMENT]))
ftype, body = c.recv()
outcome = "connection closed" if ftype is None else body[8] if ftype == wire.BATCH_REPLY else ftype
print(json.dumps({{"outcome": outcome, "untouched": ctypes.string_at({FIXED_AT}, {SIZE}) == b"\\x33" * {SIZE}}}))
"""
)
# Another process of the same uid, dumpable, with the dead client's pid: fills its buffer, waits, reports.
PID_HOLDER = (
    MAP_FIXED_AT
    + f"""
import json, sys
ctypes.memset({FIXED_AT}, 0x55, {SIZE})
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps({{"untouched": ctypes.string_at({FIXED_AT}, {SIZE}) == b"\\x55" * {SIZE}}}), flush=True)
"""
)


class PidHolder:
    """A python running `script` as another process under a given pid, with pipes to its stdin and stdout."""

    def __init__(self, pid: int, stdin: int, stdout: int):
        self.pid = pid
        self.stdin = os.fdopen(stdin, "w")
        self.stdout = os.fdopen(stdout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.stdin.close()
        self.stdout.close()


def spawn_with_pid(pid: int, script: str, tries: int = 100) -> PidHolder:
    """A python running `script` under `pid` (free: its process exited and was reaped), through
    /proc/sys/kernel/ns_last_pid (root), written just before a bare fork. Another process's fork in
    between takes the pid: then tried again once the pid is free."""
    for _ in range(tries):
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}"):  # taken by someone else's fork meanwhile: wait for it to end
            assert time.monotonic() < deadline, f"pid {pid} stays taken by another process"
            time.sleep(0.05)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        last = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY)
        os.write(last, str(pid - 1).encode())
        child = os.fork()
        if child == 0:  # exec at once: this test process has threads
            try:
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.execv(sys.executable, [sys.executable, "-c", script])
            finally:
                os._exit(127)
        for fd in (last, in_r, out_w):
            os.close(fd)
        holder = PidHolder(child, in_w, out_r)
        if child == pid:
            return holder
        holder.kill()
    pytest.fail(f"no process got pid {pid} in {tries} tries (other processes forked first)")


def test_client_exited_while_a_forked_child_keeps_the_socket_writes_into_no_process(card_gateway):
    """The registered process exits; the child it forked keeps the connection and asks for a load into
    its own memory (the same address as the parent's). The gateway writes into the process that
    registered, which is gone: the load fails (the connection ends, docs/protocol.md "Errors"), the
    child's buffer stays as it was, and so does that of a new process of the same uid that now holds
    the dead client's pid (the pid reuse the pidfd check guards against); the gateway serves on."""
    assert os.geteuid() == 0, "this test needs root: it hands the dead client's pid to another process"
    gw = card_gateway
    store(gw, ["fork@a"])
    client = subprocess.Popen(
        [sys.executable, "-c", FORKED_CLIENT, gw.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    holder = None
    try:
        line = client.stdout.readline()
        registered = json.loads(line)["registered"]
        assert client.wait(timeout=30) == 0  # exited and reaped: its pid is free
        assert stats(gw)["process_loads"] == 1
        holder = spawn_with_pid(registered, PID_HOLDER)
        assert holder.stdout.readline() == "ready\n"
        client.stdin.write("go\n")  # the forked child, still reading the same pipe
        client.stdin.flush()
        child = json.loads(client.stdout.readline())
        holder.stdin.write("done\n")
        holder.stdin.flush()
        held = json.loads(holder.stdout.readline())
        assert held["untouched"], f"bytes landed in pid {registered}, now another process"
        assert child["untouched"], "bytes landed in the forked child, which never registered"
        assert child["outcome"] == "connection closed", child
        assert stats(gw)["process_loads"] == 1
        assert "gone after" in gw.log()
        other = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
        out = bytearray(SIZE)
        assert other.get(["fork@a"], [memoryview(out)])[2] == [True] and bytes(out) == payload("fork@a", SIZE)
        other.conn.close()
    finally:
        client.stdin.close()  # the forked child, if still waiting, reads EOF and ends
        client.kill()
        client.wait()
        if holder:
            holder.kill()


def test_the_load_buffers_of_all_connections_stay_within_the_total(gateways):
    """The buffers disk-card loads keep (hold_) are bounded all together by
    --max-store-buffer-total-mb (apart from the store buffers): reserved
    before the read, a load that finds no room fails Busy (a miss), and loads
    once a hold is given back. Three connections of 3 MiB objects, a total of
    8 MiB: two keep theirs, the third is refused."""
    gw = gateways(False, extra=("--max-store-buffer-total-mb", "8"))
    conns = []
    try:
        keys = [f"total@{i}" for i in range(3)]
        store(gw, keys)
        hits = []
        for k in keys:  # one connection each, kept open (and so its hold, for 5 s idle)
            c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
            conns.append(c)
            out = bytearray(SIZE)
            ok, _, per_key = c.get([k], [memoryview(out)])
            hits.append(bool(per_key[0]) and bytes(out) == payload(k, SIZE))
        st = stats(gw)
        assert hits == [True, True, False], (hits, st)
        assert st["process_loads"] == 2 and st["load_hold_busy"] == 1 and st["store_buffer_busy"] == 0, st
        assert 2 * (4096 + SIZE) <= st["load_hold_bytes"] <= 8 * MIB, st
        conns.pop(0).conn.close()  # its hold is given back with the connection
        assert eventually(lambda: stats(gw)["load_hold_bytes"] <= 8 * MIB - (4096 + SIZE)), stats(gw)
        out = bytearray(SIZE)
        ok, _, per_key = conns[-1].get([keys[2]], [memoryview(out)])
        assert per_key[0] and bytes(out) == payload(keys[2], SIZE), stats(gw)
    finally:
        for c in conns:
            c.conn.close()


@pytest.mark.parametrize("store_buffer_mb", [256, 1])
def test_a_disk_cards_load_buffer_is_counted_and_given_back(gateways, store_buffer_mb):
    """From a card that is not memory-speed, a process load is read into an
    I/O context's staging, which then trades places with the connection's own
    buffer: the connection keeps an object's worth between batches. It is
    counted in `load_hold_bytes`, given back after 5 s idle, and at once after
    the batch when larger than a store buffer may be (--max-store-buffer-mb)."""
    gw = gateways(False, extra=("--max-store-buffer-mb", str(store_buffer_mb)))
    c = None
    try:
        keys = [f"hold@{i}" for i in range(2)]
        store(gw, keys)
        assert stats(gw)["load_hold_bytes"] == 0
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
        outs = [bytearray(SIZE) for _ in keys]
        ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
        assert ok and all(per_key) and [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
        st = stats(gw)  # the loading connection stays open, and idle
        assert st["process_loads"] == len(keys), st
        if store_buffer_mb * MIB < SIZE:
            # given back after the batch (after its reply: counted at the read, so a stats
            # connection served between the two may see it), well before the 5 s idle rule
            assert eventually(lambda: stats(gw)["load_hold_bytes"] == 0, timeout_s=2.5), stats(gw)
        else:
            assert st["load_hold_bytes"] >= 4096 + SIZE, st  # header block and payload, counted at the read
            assert eventually(lambda: stats(gw)["load_hold_bytes"] == 0), stats(gw)
        ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])  # and loads go on
        assert ok and all(per_key) and [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
        c.conn.close()
        c = None
        assert eventually(lambda: stats(gw)["load_hold_bytes"] == 0), stats(gw)  # the connection ended
    finally:
        if c is not None:
            c.conn.close()
