# SPDX-License-Identifier: Apache-2.0
"""No late bytes on puts (issue 9, item 3): a store whose future failed (1 ms
deadline) while its bytes were still to be copied is never indexed with bytes
read after the failure. The caller overwrites its buffers as soon as the
future fails, as LMCache may; nothing it overwrote is ever served, on the
ring and on TCP.

ADP_TEST_PUT_COPY_DELAY_MS holds each put round between its start and the
copy of its bytes, so the deadline passes exactly there every time instead of
once in a while under load."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from lmcache_adp import ADPConnector
from tests.helpers import RawConnector, hits_hold_their_own, payload
from tests.support.gateway import Gateway

SIZE = 8192
MARK = b"\xee"


@pytest.fixture
def shm_gateway():
    # tmpfs card: the gateway stores well within a millisecond, so it would
    # index whatever bytes reached it.
    d = tempfile.mkdtemp(prefix="adplb-", dir="/dev/shm")
    gw = Gateway(d, tcp=True).start()
    yield gw
    if gw.proc:
        gw.kill()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("transport", ["ring", "tcp"])
def test_failed_put_never_indexes_overwritten_bytes(shm_gateway, monkeypatch, transport):
    gw = shm_gateway
    url, extra = (gw.unix_url, {}) if transport == "ring" else (gw.tcp_url, {"token_file": gw.token_file})
    monkeypatch.setenv("ADP_TEST_PUT_COPY_DELAY_MS", "20")
    c = RawConnector(ADPConnector(gateway=url, timeout_ms=1, num_workers=2, **extra))
    monkeypatch.delenv("ADP_TEST_PUT_COPY_DELAY_MS")
    keys = [f"late@{transport}@{i}" for i in range(24)]
    for k in keys:
        buf = bytearray(payload(k, SIZE))
        ok, _, _ = c.set([k], [memoryview(buf)])
        assert not ok  # 1 ms: the future fails while the worker waits to copy
        buf[:] = MARK * SIZE  # LMCache reuses the buffer at once
    c.conn.close()

    per_key = hits_hold_their_own(url, keys, SIZE, "bytes the caller overwrote after its store failed", **extra)
    # Nothing copied after the failure reached the gateway: no store was indexed.
    assert per_key == [False] * len(keys)
