# SPDX-License-Identifier: Apache-2.0
"""Error texts reach Python whole and valid (utf34): the gateway cut a per-key error text at byte 256 of the wire
(kMaxMessageBytes), inside a UTF-8 character where a non-ASCII card path or key put one there, and pybind11's
strict std::string -> str made the connector's drain_completions raise UnicodeDecodeError in LMCache's completion
thread. The gateway now clips texts between characters (util/clip.h), and the bindings decode every text from a
peer or the card with errors="replace" (_native._peer_text), so no byte a peer sends can raise there."""

from __future__ import annotations

import os

import pytest

from lmcache_adp import ADPConnector, _native
from tests.gateway import wire
from tests.gateway.test_failures import keys_and_datas
from tests.helpers import RawConnector
from tests.support import cpp
from tests.support.gateway import Gateway

END = "unexpected end of card "  # the card device's message for a read past a truncated image


@pytest.mark.parametrize(
    "raw, text",
    [
        (b"abc", "abc"),
        ("card /tmp/\u00e9\u20ac".encode(), "card /tmp/\u00e9\u20ac"),
        (b"cut \xc3", "cut \ufffd"),  # a 2-byte character cut after its lead byte
        (b"cut \xe2\x82", "cut \ufffd"),  # a 3-byte one after 2 of its bytes
        (b"\xff\xfe key \x80", "\ufffd\ufffd key \ufffd"),  # bytes no UTF-8 text has
        (b"", ""),
    ],
)
def test_peer_text_decodes_invalid_utf8_with_replacement(raw, text):
    """The bindings' helper for a peer's or the card's text: valid UTF-8 as it is, each malformed byte U+FFFD,
    never UnicodeDecodeError."""
    assert _native._peer_text(raw) == text


@pytest.mark.parametrize(
    "frame, said",
    [
        (b"\x01\x02", "malformed frame: shorter than its header"),
        (wire.HEADER.pack(0x1234, 1, 1, 0, 0, 0, 1), "bad frame magic"),
        (wire.frame(wire.HELLO, 1, b"", version=9), "protocol version 9 (this side speaks 1)"),
        (wire.frame(99, 1, b""), "unknown frame type 99"),
        (wire.frame(wire.HELLO, 1, b"abc", body_bytes=5), "malformed frame: body length disagrees with the header"),
        (wire.frame(wire.HELLO, 1, wire.hello()[:-3]), "malformed hello: lengths disagree with the body"),
    ],
)
def test_parse_frame_refuses_as_the_other_bindings_do(frame, said):
    """py35: parse_frame's binding raised its message through pybind11's ValueError, which decodes it strictly (a
    byte that is not UTF-8 there raised UnicodeDecodeError, itself a ValueError, with the message lost); it now
    raises as every other binding does (raise(): ValueError for InvalidArgument, the text through _peer_text's
    errors="replace"). Its texts are fixed ASCII today: this holds each refusal's type and text."""
    with pytest.raises(ValueError) as refused:
        _native.parse_frame(frame)
    assert refused.type is ValueError and str(refused.value) == said


def test_a_refusal_at_accept_is_cut_between_characters(tmp_path):
    """py35: the gateway's refusal of a connection at accept (proto::refuse_at_accept: too many clients or
    handshakes, no thread) formatted its text into a buffer of kMaxMessageBytes + 1, so a text longer than the
    bound was cut at it by vsnprintf, inside a character that crossed it, before send_error_frame's clip_utf8 could
    see that byte. Builds tests/cpp/refuse_text_test.cc: a 2- and a 3-byte character across the bound are left
    out whole, one ending at it is kept, short and exactly-bound texts go as they are."""
    cpp.run(
        cpp.build(
            "refuse_text_test",
            tmp_path,
            (),
            ("protocol/socket_io.cc", "protocol/frame.cc", "util/log.cc", "util/status.cc"),
        ),
        timeout=60,
    )


def test_an_error_text_cut_at_a_multibyte_character_reaches_drain_valid(workdir):
    """A real gateway (unix://) on a card whose path puts a 2-byte character at bytes 255-256 of the card's read
    error ("unexpected end of card <path> at offset N", over 256 bytes): the failed load's completion drains
    without raising, and its text is valid UTF-8 cut before that character, not inside it (no U+FFFD)."""
    head = END + os.path.abspath(workdir) + "/"
    pad = 255 - len(head.encode())  # ASCII bytes before the character at byte 255
    assert 0 < pad < 2 * 200
    sub = os.path.join("a" * (pad // 2), "b" * (pad - pad // 2 - 1))  # two components, each under NAME_MAX
    card = os.path.join(workdir, sub + "\u00e9" * 8, "card.img")
    assert len((END + card).encode()) > 256 and (END + card).encode()[255:257] == "\u00e9".encode()
    os.makedirs(os.path.dirname(card))
    gw = Gateway(workdir, card=card).start()
    size = 0
    try:
        keys, datas = keys_and_datas(3)
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=5000))
        try:
            ok, err, _ = c.set(keys, [memoryview(d) for d in datas])
            assert ok, err
            size = os.path.getsize(card)
            os.truncate(card, 1 << 20)  # the card fails reads past 1 MiB: the objects stored lie past it
            outs = [bytearray(len(d)) for d in datas]
            ok, err, per_key = c.get(keys, [memoryview(o) for o in outs])  # drains: UnicodeDecodeError before
        finally:
            c.conn.close()
        assert not ok and not any(per_key), (ok, err)
        assert END in err and "\ufffd" not in err, err
        why = err[err.index(END) :]
        assert why == (END + card)[:255], why  # the 256-byte bound met at the character's start, not inside it
        err.encode()  # valid: every character encodes back
    finally:
        if size:
            os.truncate(card, size)
        assert gw.stop() == 0
