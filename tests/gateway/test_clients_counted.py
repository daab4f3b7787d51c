# SPDX-License-Identifier: Apache-2.0
"""A client is in the gateway's `clients` by the time it has its HelloOk (brief defects item 4): counted after the
HelloOk was written, a stats read the client made right after its handshake could miss it, for as long as the
connection's thread took to go on (a loaded host). ADP_TEST_HELLO_OK_DELAY_MS holds that thread after the write."""

from __future__ import annotations

import socket
import time

from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway import wire
from tests.support.gateway import Gateway


def test_a_client_is_counted_before_its_hello_ok(workdir):
    gw = Gateway(workdir).start(env={"ADP_TEST_HELLO_OK_DELAY_MS": "3000"})
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(gw.socket)
            s.sendall(wire.frame(wire.HELLO, 1, wire.hello()))
            assert wire.recv_frame(s)[0] == wire.HELLO_OK
            read_at = time.monotonic()
            st = read_gateway_stats(gw.unix_url)  # a status query: not held by the hook, not a client
            assert time.monotonic() - read_at < 2.5, "the stats were not read within the hook's hold"
            assert st["clients"] == 1, st
        give_up = time.monotonic() + 10
        while read_gateway_stats(gw.unix_url)["clients"]:  # given back when the connection ends
            assert time.monotonic() < give_up
            time.sleep(0.05)
    finally:
        assert gw.stop() == 0
