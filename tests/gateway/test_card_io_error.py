# SPDX-License-Identifier: Apache-2.0
"""Which of a gateway's I/O-error answers are its card failing (the connector's gateway_card_healthy and
/health) and which are not: its own memory ("out of memory ...") and its process_vm_readv/writev of the
client's memory ("process_vm_..."). Since protocol r9 (feature bit 8, FEATURE_ERROR_CLASS) a gateway sends each
I/O error's class in its reply item (1 the card, 2 its memory, 3 the client's) to a connector that asks, and
the connector goes by it; a gateway of r8 or older sends none, and the connector tells them by the message's
start (src_cpp/transport/card_io_error.h; review r10 N5). These tests pin both sides: the gateway's sources
still send those messages as they start, with their class, every one of its I/O errors about memory starts so;
the card device's own I/O errors, as it makes them (a failed read, write and fdatasync, an image cut short), are
the card's;
the connector reads each message of an r8 gateway as it should and an r9 gateway's class over the message
(through a fake gateway over TCP that answers a load with them); a real gateway sends the class only to a client
that asked, and to one that did not the bytes of r8."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import socket
import struct
from pathlib import Path

import pytest

from lmcache_adp import ADPConnector
from lmcache_adp._native import FEATURE_ERROR_CLASS
from tests.gateway import wire
from tests.gateway.test_failures import keys_and_datas
from tests.gateway.test_process_stores import send_process_put, store_client
from tests.helpers import RawConnector, payload
from tests.support import cpp
from tests.support.gateway import TOKEN, Gateway, temp_gateway

SRC = Path(__file__).resolve().parents[2] / "src_cpp"
# The sources a gateway runs an item through (its connections, the card store, process memory).
GATEWAY_SOURCES = ("gateway", "store", "protocol")

# Every I/O error the gateway answers that is not its card's, as its message starts: where it is made and
# the class it is made with (r9; Status::IoClass).
NOT_CARD = {
    "out of memory for the store buffer of ": ("gateway/budgets.cc", "kGatewayMemory"),
    "out of memory for staging": ("store/card_store_put.cc", "kGatewayMemory"),
    "out of memory for a bounce buffer": ("store/card_store_get.cc", "kGatewayMemory"),
    "out of memory for recovery": ("store/recovery.cc", "kGatewayMemory"),
    "out of memory": ("store/card_store.cc", "kGatewayMemory"),
    "process_vm_readv of ": ("protocol/process_memory.cc", "kClientMemory"),
    "process_vm_writev of ": ("protocol/process_memory.cc", "kClientMemory"),
}
NOT_CARD_STARTS = ("out of memory", "process_vm_")
# The classes on the wire (docs/protocol.md, r9).
CARD, GATEWAY_MEMORY, CLIENT_MEMORY = 1, 2, 3


def io_error_calls() -> list[tuple[str, list[str], str]]:
    """Each Status::IoError(...) of the gateway's sources: (file under src_cpp, the string literals its message
    can start with: those before the first `+`, both arms of a `a ? "x" : "y"`; the call's arguments)."""
    found = []
    for d in GATEWAY_SOURCES:
        for p in sorted((SRC / d).glob("*.cc")) + sorted((SRC / d).glob("*.h")):
            text = p.read_text()
            for m in re.finditer(r"Status::IoError\(", text):
                depth, i = 1, m.end()
                while depth:  # to the call's closing parenthesis (message literals hold none unbalanced)
                    depth += {"(": 1, ")": -1}.get(text[i], 0)
                    i += 1
                arg = text[m.end() : i - 1]
                head = re.split(r'\+(?=(?:[^"]*"[^"]*")*[^"]*$)', arg, maxsplit=1)[0]  # before a + outside quotes
                found.append((p.relative_to(SRC).as_posix(), re.findall(r'"((?:[^"\\]|\\.)*)"', head), arg))
    return found


def io_error_starts() -> list[tuple[str, list[str]]]:
    return [(f, lits) for f, lits, _ in io_error_calls()]


def test_the_gateways_non_card_io_errors_still_start_as_the_connector_expects():
    """A gateway message edit would silently change what /health says: each message of NOT_CARD is still made
    where it was (edit it here and in card_io_error.h together), and every I/O error of the gateway's sources
    that speaks of memory (its own, or the client's through process_vm_*) starts with a prefix the connector
    reads as not the card."""
    calls = io_error_calls()
    sites = [(f, lits) for f, lits, _ in calls]
    assert len(sites) > 20, sites  # the scan finds the calls
    for start, (where, _) in NOT_CARD.items():
        assert any(f == where and start in lits for f, lits in sites), f'no IoError("{start}...") in {where}'
    about_memory = re.compile(r"memory|alloc|process_vm|ENOMEM", re.I)
    for f, lits, arg in calls:
        for lit in lits:
            if about_memory.search(lit):
                assert lit.startswith(NOT_CARD_STARTS), (
                    f'{f}: IoError("{lit}...") is about memory but an r8 connector reads it as the card failing '
                    f"(src_cpp/transport/card_io_error.h: kNotCardIoErrors)"
                )
                # r9: and it is made with its class, or an r9 connector reads it as the card (an unmarked
                # I/O error goes on the wire as the card's).
                cls = next(c for start, (_, c) in NOT_CARD.items() if lit.startswith(start) or start.startswith(lit))
                assert f"Status::IoClass::{cls}" in arg, f'{f}: IoError("{lit}...") is not made with {cls}: {arg}'
    # Nothing else is made with a class that is not the card (a class the message rule would contradict).
    for f, lits, arg in calls:
        if "IoClass::" in arg:
            assert lits and lits[0].startswith(NOT_CARD_STARTS), (f, lits, arg)


def card_device_errors(tmp_path) -> dict[str, str]:
    """The messages of a card image's device (store/card_device.cc) failing a read and a write (EFAULT), reading
    past the image's end (cut short under it) and failing an fdatasync (EINVAL: a pipe in its descriptor's place),
    as it makes them (tests/cpp/card_io_error_test.cc, which also checks that transport/card_io_error.h reads each
    as the card's), by kind: read, write, end, sync."""
    binary = cpp.build(
        "card_io_error_test",
        tmp_path,
        ("util",),
        ("store/card_device.cc", "store/card_format.cc", "store/new_image.cc"),
    )
    out = cpp.run(binary, str(tmp_path), timeout=120)
    return dict(line.split(" ", 2)[1:] for line in out.splitlines() if line.startswith("MESSAGE "))


def test_the_card_devices_io_errors_are_the_card_failing(tmp_path):
    """What is the card: a card image's device failing a read, a write, a read past its end and an fdatasync says
    which and where, and a connector answered with that message (an r8 gateway's load, no class) reads it as the
    card failing: gateway_card_healthy 0, the message in gateway_card_error. Behaviour, where this once scanned
    card_device.cc for the literals "read", "write" and "fdatasync of" inside its IoError calls."""
    errors = card_device_errors(tmp_path)
    assert set(errors) == {"read", "write", "end", "sync"}, errors
    image = str(tmp_path / "card-io-error.img")
    assert errors["read"] == f"read of 4096 bytes at offset 8192 of {image} failed: Bad address", errors
    assert errors["write"] == f"write of 4096 bytes at offset 12288 of {image} failed: Bad address", errors
    assert errors["end"] == f"unexpected end of card {image} at offset 131072", errors
    assert errors["sync"] == f"fdatasync of {image} failed: Invalid argument", errors
    for kind, message in errors.items():
        err, st = failed_load(tmp_path, wire.FailingGateway(message.encode()))
        assert message in err, (kind, err)
        assert (st["gateway_card_healthy"], st["gateway_card_error"]) == (False, message), (kind, st)


# Messages as the gateway makes them (the literals above, completed), with whether they are the card.
ANSWERS = [
    ("out of memory for the store buffer of 96 MiB", False),
    ("out of memory for staging", False),
    ("out of memory for a bounce buffer", False),
    ("out of memory", False),
    ("process_vm_readv of 4194304 bytes at 0x7f12a4000000 in pid 4242: Cannot allocate memory", False),
    ("process_vm_writev of 4194304 bytes at 0x7f12a4000000 in pid 4242: Cannot allocate memory", False),
    ("read of 4096 bytes at offset 8192 of /cards/card.img failed: Input/output error", True),
    ("unexpected end of card /cards/card.img at offset 2097152", True),
    ("fdatasync of /cards/card.img failed: Input/output error", True),
    ("an earlier store in the region failed and could not be marked", True),
]


@pytest.mark.parametrize("message, card", ANSWERS, ids=[m[:26] for m, _ in ANSWERS])
def test_the_connector_tells_the_card_by_the_message(tmp_path, message, card):
    """A (fake) gateway answers a load with an I/O error of `message`: the load fails with it either way; the
    connector's gateway_card_healthy is 0 with the message in gateway_card_error for a card's, 1 otherwise."""
    gw = wire.FailingGateway(message.encode())  # an r8 gateway: no class
    err, st = failed_load(tmp_path, gw)
    assert message in err, err
    assert (st["gateway_card_healthy"], st["gateway_card_error"]) == ((False, message) if card else (True, "")), st
    assert gw.hellos and all(f & FEATURE_ERROR_CLASS for f in gw.hellos), gw.hellos  # it asked; not granted


def failed_load(tmp_path, gw: wire.FailingGateway) -> tuple[str, dict]:
    """A one-worker connector over TCP to gw loads one key, which fails: the error and the connector's stats
    after it (gw closed at the end)."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    c = RawConnector(ADPConnector(gateway=f"tcp://127.0.0.1:{gw.port}", token_file=str(token), num_workers=1))
    try:
        ok, err, per_key = c.get(["k"], [memoryview(bytearray(4096))])
        assert not ok and per_key == [False], err
        return err, c.conn.stats()
    finally:
        c.conn.close()
        gw.close()


# r9: the class decides, whatever the message says (each message says the opposite of its class here).
CLASSED = [
    ("out of memory for staging", CARD, True),
    ("process_vm_readv of 4096 bytes at 0x7f12a4000000 in pid 4242: Cannot allocate memory", CARD, True),
    ("read of 4096 bytes at offset 8192 of /cards/card.img failed: Input/output error", GATEWAY_MEMORY, False),
    ("unexpected end of card /cards/card.img at offset 2097152", CLIENT_MEMORY, False),
]


@pytest.mark.parametrize("message, io_class, card", CLASSED, ids=[f"{m[:20]}-{c}" for m, c, _ in CLASSED])
def test_the_connector_tells_the_card_by_the_class_where_the_gateway_sends_one(tmp_path, message, io_class, card):
    """An r9 (fake) gateway grants FEATURE_ERROR_CLASS to the connector, which asks for it, and answers a load with
    an I/O error of `message` and `io_class`: the load fails with the message either way; gateway_card_healthy
    follows the class (1 the card: 0, the message in gateway_card_error; 2 or 3: 1), not the message's start."""
    err, st = failed_load(tmp_path, wire.FailingGateway(message.encode(), error_class=io_class, grant=True))
    assert message in err, err
    assert (st["gateway_card_healthy"], st["gateway_card_error"]) == ((False, message) if card else (True, "")), st


# A class where none may be: not granted, on a status other than an I/O error, none on an I/O error that must
# have one, one past the last.
BAD_CLASS = [
    (wire.IO_ERROR, CARD, False),
    (2, CARD, True),  # invalid argument
    (wire.IO_ERROR, 0, True),
    (wire.IO_ERROR, CLIENT_MEMORY + 1, True),
]


@pytest.mark.parametrize("code, io_class, grant", BAD_CLASS, ids=["ungranted", "not-io", "missing", "unknown"])
def test_a_class_where_none_may_be_is_a_malformed_reply(tmp_path, code, io_class, grant):
    """A (broken) gateway whose reply item carries a class byte the negotiation does not allow: the connector
    reads the whole reply as malformed (as an r8 connector reads any nonzero byte there), the load fails, and
    the card is not taken for failing by it."""
    gw = wire.FailingGateway(b"read of 4096 bytes failed: Input/output error", code, error_class=io_class, grant=grant)
    err, st = failed_load(tmp_path, gw)
    assert "malformed batch reply: bad error class" in err, err
    assert st["gateway_card_healthy"] is True


@contextlib.contextmanager
def raw_tcp(gw: Gateway, features: int):
    """A hand-driven TCP connection to gw whose Hello offers `features`; yields (socket, granted features)."""
    s = socket.create_connection(("127.0.0.1", gw.port))
    s.settimeout(10)
    try:
        s.sendall(wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode(), features=features)))
        ftype, _, body = wire.recv_frame(s)
        assert ftype == wire.HELLO_OK, body
        yield s, struct.unpack_from("<I", body)[0]
    finally:
        s.close()


def reply_items(body: bytes) -> tuple[list[tuple[int, int, int, int, int]], list[bytes]]:
    """A BatchReply body's items (status, class byte, msg_len, reserved, size) and messages."""
    count, pad = struct.unpack_from("<II", body)
    assert pad == 0
    items = [struct.unpack_from("<BBHIQ", body, 8 + 16 * i) for i in range(count)]
    msgs, at = [], 8 + 16 * count
    for it in items:
        msgs.append(body[at : at + it[2]])
        at += it[2]
    return items, msgs


def test_a_card_io_error_on_the_wire_carries_its_class_only_where_asked(workdir):
    """A real gateway whose card fails reads (truncated under it): a raw TCP client that offers FEATURE_ERROR_CLASS
    is granted it and gets class 1 (the card) in each failed item's byte 1; one that does not (a client of r8)
    gets the bit refused and, for the same batch, exactly the reply of r8: the other's bytes with that byte 0.
    A hit and a miss in the same batch carry no class either way."""
    gw = Gateway(workdir, tcp=True).start()
    size = 0
    try:
        keys, datas = keys_and_datas(3)
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=5000))
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        c.conn.close()
        size = os.path.getsize(gw.card)
        os.truncate(gw.card, 1 << 20)  # the card fails reads past 1 MiB: the objects stored lie past it
        names = [k.encode() for k in keys] + [b"absent"]
        sizes = [len(d) for d in datas] + [4096]
        bodies = {}
        for asked in (True, False):
            with raw_tcp(gw, FEATURE_ERROR_CLASS if asked else 0) as (s, granted):
                assert bool(granted & FEATURE_ERROR_CLASS) == asked, granted
                s.sendall(wire.frame(wire.BATCH, 2, wire.batch(wire.GET, names, sizes, [0] * len(names))))
                ftype, rid, body = wire.recv_frame(s)
                assert (ftype, rid) == (wire.BATCH_REPLY, 2), body
                bodies[asked] = body
        items, msgs = reply_items(bodies[True])
        assert [(it[0], it[1]) for it in items] == [(wire.IO_ERROR, CARD)] * 3 + [(1, 0)], items  # 1: not found
        assert all(m.startswith(b"unexpected end of card") for m in msgs[:3]) and msgs[3] == b"", msgs
        old = bytearray(bodies[True])
        for i in range(len(items)):
            old[8 + 16 * i + 1] = 0
        assert bodies[False] == bytes(old)
    finally:
        if size:
            os.truncate(gw.card, size)
        assert gw.stop() == 0


@pytest.mark.parametrize("asked", [True, False])
def test_the_gateways_memory_on_the_wire_is_class_2_only_where_asked(asked):
    """A real gateway that cannot map a store buffer (its address space capped with RLIMIT_AS, as
    test_health.py's test_the_gateways_memory_is_not_its_card_failing): a raw process-memory store of 96 MiB
    answers "out of memory for the store buffer of ..." (an I/O error) with class 2 (the gateway's memory) to a
    client that asked for FEATURE_ERROR_CLASS, and with byte 1 zero (the reply of r8) to one that did not."""
    with temp_gateway(memory=False) as gw:
        with store_client(gw, FEATURE_ERROR_CLASS if asked else 0) as c:
            assert bool(c.features & FEATURE_ERROR_CLASS) == asked, c.features
            big = 96 << 20
            src = ctypes.create_string_buffer(payload("big", 4096) * (big // 4096), big)
            with open(f"/proc/{gw.proc.pid}/status") as f:
                vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
            resource.prlimit(gw.proc.pid, resource.RLIMIT_AS, (vm + (16 << 20), resource.RLIM_INFINITY))
            try:
                send_process_put(c, "big", big, src, 5000)
                ftype, body = c.recv()
            finally:
                resource.prlimit(gw.proc.pid, resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            assert ftype == wire.BATCH_REPLY, (ftype, body)
            items, msgs = reply_items(body)
            assert msgs[0].startswith(b"out of memory for the store buffer of "), msgs
            assert (items[0][0], items[0][1]) == (wire.IO_ERROR, GATEWAY_MEMORY if asked else 0), items
