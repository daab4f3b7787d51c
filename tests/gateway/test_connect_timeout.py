# SPDX-License-Identifier: Apache-2.0
"""adapter_params connect_timeout_ms: every connect a connector on a gateway makes (the start-up connect, a
batch's, the background reconnect's, an idle connector's status query) gives up after it, not after a fixed 2 s
(session 30: kConnectTimeout, which only a test hook changed, and not for the status query). Measured on a
stand-in that reads each Hello and never answers it (tests/support/silent_gateway.py): how long each connection
was held from its Hello to the client's close. Bounds with wide margins either side of the 2 s default: 300 ms
must end well before it (< 1.5 s), 3000 ms well after it (> 2.5 s: a connect bounded by the 2 s default is held
2.00 s, which "> 2 s" let through on the old code's status query by 2 ms)."""

from __future__ import annotations

import os
import time

import pytest

from lmcache_adp import ADPConnector
from tests.helpers import RawConnector, eventually
from tests.support.gateway import temp_gateway
from tests.support.silent_gateway import Held, SilentGateway

DEFAULT_S = 2.0
LONG_HELD_S = 2.5  # the least a 3000 ms connect is held: 500 ms for the stand-in to read the Hello late


def within_bound(held: list[Held], bound_ms: int) -> bool:
    """Each connection given up near bound_ms: before 1.5 s for a bound under the 2 s default, after LONG_HELD_S for
    one over it (the stand-in reads the Hello a little after the connect began, so a held time is at most the
    bound)."""
    if bound_ms < DEFAULT_S * 1000:
        return all(h.held_s < 1.5 for h in held)
    return all(LONG_HELD_S < h.held_s <= bound_ms / 1000 + 5 for h in held)


def bound_named(bound_ms: int) -> str:
    return f"did not answer in time (its connect's bound, connect_timeout_ms: {bound_ms} ms)"


@pytest.mark.parametrize("bound_ms", [300, 3000])
def test_connects_give_up_after_connect_timeout_ms(bound_ms, workdir, capfd):
    """The start-up connect, a batch's own connect (issued at once: it waits 100 ms for the start-up connect, then
    connects itself) and the background reconnect's: each held for about connect_timeout_ms; the batch fails
    "unavailable" with the bound named (its timeout_ms, 20 s, is not what ended it), and so does the one outage
    WARNING."""
    with SilentGateway(os.path.join(workdir, "silent.sock")) as silent:
        capfd.readouterr()
        made = time.monotonic()
        conn = ADPConnector(gateway=silent.url, num_workers=1, timeout_ms=20000, connect_timeout_ms=bound_ms)
        try:
            ok, why, _ = RawConnector(conn).set(["k"], [memoryview(b"v")])
            took = time.monotonic() - made
            assert not ok and "unavailable" in why and bound_named(bound_ms) in why, why
            assert took < 1.5 if bound_ms < 2000 else took > LONG_HELD_S, (took, why)
            # The start-up connect's and the batch's (in either order), then the background reconnect's: it
            # connects once the batch's back-off is over, with no batch to stand aside for.
            held = silent.wait_ended(3)
            assert within_bound(held, bound_ms), held
            assert not any(h.query for h in held), held
            assert conn.stats()["gateway_reachable"] is False
        finally:
            conn.close()
    err = capfd.readouterr().err
    warned = [line for line in err.splitlines() if "its requests fail until" in line]
    assert len(warned) == 1 and " WARNING: " in warned[0] and bound_named(bound_ms) in warned[0], err


@pytest.mark.parametrize("bound_ms", [300, 3000])
def test_an_idle_connectors_status_query_gives_up_after_connect_timeout_ms(bound_ms, capfd):
    """An idle connector whose gateway stops asks a status query (RemoteBackend::probe) at its reconnect thread's
    next look: to a gateway that accepts and never answers, that query is held for connect_timeout_ms (it used
    kConnectTimeout whatever the test hook said, 2 s), then the outage WARNING names the bound; the reconnects
    after it are bounded alike. The connector reaches the gateway through a symlink, turned to the stand-in
    before the gateway stops, so the query's connect meets the stand-in."""
    with temp_gateway() as gw:
        link = os.path.join(gw.workdir, "link.sock")
        os.symlink(gw.socket, link)
        capfd.readouterr()
        conn = ADPConnector(gateway="unix://" + link, num_workers=1, timeout_ms=20000, connect_timeout_ms=bound_ms)
        try:
            # The start-up connect's INFO line: its handshake is over (gateway_reachable reads 1 before it too, and a
            # stop in its handshake failed it "connection closed": no status query).
            said: list[str] = []
            assert eventually(lambda: said.append(capfd.readouterr().err) or ": connected (" in "".join(said), 10)
            with SilentGateway(os.path.join(gw.workdir, "silent.sock")) as silent:
                os.symlink(silent.path, link + ".new")
                os.replace(link + ".new", link)
                capfd.readouterr()
                assert gw.stop() == 0  # closes the connector's connection: its next look (1 s) asks a status query
                query = silent.wait_ended(1, query=True)
                assert within_bound(query, bound_ms), query
                assert eventually(lambda: conn.stats()["gateway_reachable"] is False, 10)
                err = capfd.readouterr().err
                warned = [line for line in err.splitlines() if "its requests fail until" in line]
                assert len(warned) == 1 and "the gateway closed this connector's connections" in warned[0], err
                assert bound_named(bound_ms) in warned[0], err
                reconnect = silent.wait_ended(1, query=False)  # the background reconnect's, after the outage
                assert within_bound(reconnect, bound_ms), reconnect
        finally:
            conn.close()
