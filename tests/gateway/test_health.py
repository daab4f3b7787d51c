# SPDX-License-Identifier: Apache-2.0
"""A connector on a gateway with a metrics port: /health and gateway_reachable
say whether its gateway can be reached (README "Operations", docs/stats.md)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from lmcache_adp import ADPConnector
from lmcache_adp.ops import format_status
from tests.gateway.test_failures import keys_and_datas
from tests.helpers import RawConnector
from tests.ops.test_metrics import free_port, scrape
from tests.support.gateway import Gateway


def health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_health_follows_the_gateway(workdir):
    gw = Gateway(workdir).start()
    port = free_port()
    # One worker: one connection, so the batches below are the ones that find the gateway gone and back.
    conn = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=2000, metrics_port=port)
    c = RawConnector(conn)
    try:
        keys, datas = keys_and_datas(3)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        code, doc = health(port)
        assert (code, doc["healthy"], doc["gateway_reachable"]) == (200, True, True), doc
        st = conn.stats()
        assert st["gateway_reachable"] is True and st["gateway_reconnects"] == 0, st
        assert scrape(port)["lmcache_adp_gateway_reachable"] == 1

        gw.kill()
        ok, err, _ = c.set(keys, [memoryview(d) for d in datas])
        assert not ok, "a store succeeded with the gateway killed"
        code, doc = health(port)
        assert (code, doc["healthy"], doc["gateway_reachable"]) == (503, False, False), doc
        assert any(gw.unix_url in r and "unreachable" in r for r in doc["reasons"]), doc
        assert conn.stats()["gateway_reachable"] is False
        assert "NO (loads miss" in format_status(conn.stats())  # `lmcache-adp status --url`
        m = scrape(port)
        assert m["lmcache_adp_gateway_reachable"] == 0 and m["lmcache_adp_gateway_reconnects_total"] == 0, m

        gw.start()
        deadline = time.monotonic() + 10  # the connector retries with back-off, at most 2 s apart
        while not c.set(keys, [memoryview(d) for d in datas])[0]:
            assert time.monotonic() < deadline, "connector did not reconnect:\n" + gw.log()
            time.sleep(0.1)
        code, doc = health(port)
        assert (code, doc["healthy"], doc["gateway_reachable"]) == (200, True, True), doc
        assert "reasons" not in doc, doc
        st = conn.stats()
        assert st["gateway_reachable"] is True and st["gateway_reconnects"] == 1, st
        m = scrape(port)
        assert m["lmcache_adp_gateway_reachable"] == 1 and m["lmcache_adp_gateway_reconnects_total"] == 1, m
    finally:
        conn.close()
        if gw.proc:
            assert gw.stop() == 0
