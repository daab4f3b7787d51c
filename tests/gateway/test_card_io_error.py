# SPDX-License-Identifier: Apache-2.0
"""Which of a gateway's I/O-error answers are its card failing (the connector's gateway_card_healthy and
/health) and which are not: its own memory ("out of memory ...") and its process_vm_readv/writev of the
client's memory ("process_vm_..."). The wire carries no error class, only the code and the message, so the
connector tells them by the message's start (src_cpp/transport/card_io_error.h; review r10 N5). These tests
pin both sides: the gateway's sources still send those messages as they start, every one of its I/O errors
about memory starts so, and the connector reads each of them as not the card and a card's message as the card
(through a fake gateway over TCP that answers a load with the message)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmcache_adp import ADPConnector
from tests.gateway import wire
from tests.helpers import RawConnector
from tests.support.gateway import TOKEN

SRC = Path(__file__).resolve().parents[2] / "src_cpp"
# The sources a gateway runs an item through (its connections, the card store, process memory).
GATEWAY_SOURCES = ("gateway", "store", "protocol")

# Every I/O error the gateway answers that is not its card's, as its message starts: where it is made.
NOT_CARD = {
    "out of memory for the store buffer of ": "gateway/budgets.cc",
    "out of memory for staging": "store/card_store.cc",
    "out of memory for a bounce buffer": "store/card_store.cc",
    "out of memory for recovery": "store/recovery.cc",
    "out of memory": "store/card_store.cc",
    "process_vm_readv of ": "protocol/process_memory.cc",
    "process_vm_writev of ": "protocol/process_memory.cc",
}
NOT_CARD_STARTS = ("out of memory", "process_vm_")


def io_error_starts() -> list[tuple[str, list[str]]]:
    """Each Status::IoError(...) of the gateway's sources: (file under src_cpp, the string literals its message
    can start with: those before the first `+`, both arms of a `a ? "x" : "y"`)."""
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
                found.append((p.relative_to(SRC).as_posix(), re.findall(r'"((?:[^"\\]|\\.)*)"', head)))
    return found


def test_the_gateways_non_card_io_errors_still_start_as_the_connector_expects():
    """A gateway message edit would silently change what /health says: each message of NOT_CARD is still made
    where it was (edit it here and in card_io_error.h together), and every I/O error of the gateway's sources
    that speaks of memory (its own, or the client's through process_vm_*) starts with a prefix the connector
    reads as not the card."""
    sites = io_error_starts()
    assert len(sites) > 20, sites  # the scan finds the calls
    for start, where in NOT_CARD.items():
        assert any(f == where and start in lits for f, lits in sites), f'no IoError("{start}...") in {where}'
    about_memory = re.compile(r"memory|alloc|process_vm|ENOMEM", re.I)
    for f, lits in sites:
        for lit in lits:
            if about_memory.search(lit):
                assert lit.startswith(NOT_CARD_STARTS), (
                    f'{f}: IoError("{lit}...") is about memory but the connector reads it as the card failing '
                    f"(src_cpp/transport/card_io_error.h: kNotCardIoErrors)"
                )
    # And what is the card: the card device's errors are none of those.
    card = [lit for f, lits in sites if f == "store/card_device.cc" for lit in lits]
    assert {"read", "write", "unexpected end of card ", "fdatasync of "} <= set(card), card
    assert not any(lit.startswith(NOT_CARD_STARTS) for lit in card), card


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
    gw = wire.FailingGateway(message.encode())
    token = tmp_path / "token"
    token.write_text(TOKEN)
    c = RawConnector(ADPConnector(gateway=f"tcp://127.0.0.1:{gw.port}", token_file=str(token), num_workers=1))
    try:
        ok, err, per_key = c.get(["k"], [memoryview(bytearray(4096))])
        assert not ok and message in err and per_key == [False], err
        st = c.conn.stats()
        assert (st["gateway_card_healthy"], st["gateway_card_error"]) == ((False, message) if card else (True, "")), st
    finally:
        c.conn.close()
        gw.close()
