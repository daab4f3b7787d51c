# SPDX-License-Identifier: Apache-2.0
"""What a delete reports to LMCache when it fails (LMCache reads only the
per-key bools of a delete: true lets it forget the key, false keeps it).

- Embedded: tests/cpp/delete_result_test.cc, the Connector over a card store on
  a FaultDevice whose writes fail: the tombstone cannot be written, so the key
  is false, the future fails naming it, and the object still reads back.
- Through a gateway: a gateway that answers a delete with an I/O error, and one
  that is gone, fail the future with the key false; a lookup fails the same way.
- A key that is not on the card is gone: true.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lmcache_adp import ADPConnector
from tests.gateway import wire
from tests.gateway.conftest import workdir  # noqa: F401 (a fixture)
from tests.helpers import RawConnector, payload
from tests.support import cpp
from tests.support.gateway import TOKEN, Gateway

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_delete_that_cannot_write_its_tombstone_fails(tmp_path):
    dirs = ("store", "util", "connector", "testing")
    cpp.run(cpp.build("delete_result_test", tmp_path, dirs=dirs, extra=("transport/embedded_backend.cc",)), timeout=120)


def test_delete_of_an_absent_key_is_gone(card):
    conn = RawConnector(ADPConnector(card=card, card_size_gb=0.0625))
    try:
        assert conn.set(["k"], [memoryview(payload("k", 5000))])[0]
        ok, err, deleted = conn.delete(["k", "never-stored"])
        assert ok and err == "" and deleted == [True, True]
        assert conn.exists(["k"])[2] == [False]
    finally:
        conn.conn.close()


@pytest.mark.parametrize("op", ["delete", "lookup"])
def test_gateway_that_answers_an_error_fails_the_batch(tmp_path, op):
    gw = wire.FailingGateway()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    conn = RawConnector(ADPConnector(gateway=f"tcp://127.0.0.1:{gw.port}", token_file=str(token), num_workers=1))
    submit, frame = (conn.delete, wire.DELETE) if op == "delete" else (conn.exists, wire.EXISTS)
    try:
        ok, err, per_key = submit(["k1", "k2"])
        assert gw.batches == [frame], f"the {op} reached the gateway"
        assert not ok and f"{op} of key k1 failed: injected I/O error" in err, err
        assert per_key == [False, False]
    finally:
        conn.conn.close()
        gw.close()


# A lookup has the same failure path as a delete: LMCache reads an exists future that failed as all misses,
# so it is safe either way, but a lookup that could not be answered must say so (ok=False, the reason) instead
# of reading as "not on the card".


@pytest.mark.parametrize("op", ["delete", "lookup"])
def test_a_delete_or_lookup_with_the_gateway_gone_fails(workdir, op):
    """The gateway killed under a connector: a delete (or a lookup) of a stored key and an absent one fails,
    naming the first key, both reported False; back on the same card the key was never deleted."""
    gw = Gateway(workdir).start()
    conn = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=5000))
    submit = conn.delete if op == "delete" else conn.exists
    try:
        assert conn.set(["k"], [memoryview(payload("k", 5000))])[0]
        gw.kill()
        ok, err, per_key = submit(["k", "absent"])
        assert not ok and f"{op} of key k failed" in err, err
        assert per_key == [False, False]
        gw.start()
        assert conn.exists(["k", "absent"]) == (True, "", [True, False])
    finally:
        conn.conn.close()
        if gw.proc:
            gw.kill()
