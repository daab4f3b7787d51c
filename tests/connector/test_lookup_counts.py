# SPDX-License-Identifier: Apache-2.0
"""Lookup hits and misses (audit 15 item 9): LMCache loads only the keys its lookup found, so a key the card evicted
is never a load miss and the load ratio read 100% while the card evicted prompts. The connector (embedded, and on a
gateway) counts the keys its lookups answered found / not found, the gateway the keys asked of it; `status` shows
that ratio first, and Prometheus serves both counters."""

from __future__ import annotations

import re
import tempfile
import urllib.request

import pytest

from lmcache_adp import ADPConnector
from lmcache_adp.gateway_stats import read_gateway_stats
from lmcache_adp.ops import format_status
from tests.helpers import RawConnector, payload
from tests.ops.test_metrics import free_port
from tests.support.gateway import temp_gateway

SIZE = 256 * 1024
STORED = 320  # 80 MiB of payload on a 64 MiB card: the oldest ones are evicted
NEVER = [f"never@{i}" for i in range(7)]


def fill(c: RawConnector) -> list[str]:
    """Stores STORED keys in batches of 16; returns them, oldest first."""
    keys = [f"lk@{i}" for i in range(STORED)]
    for at in range(0, STORED, 16):
        batch = keys[at : at + 16]
        datas = [payload(k, SIZE) for k in batch]
        ok, err, _ = c.set(batch, [memoryview(d) for d in datas])
        assert ok, err
    return keys


def rows(text: str) -> dict[str, str]:
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in text.splitlines())


def check_lookups(c: RawConnector, card_stats) -> tuple[int, int]:
    """Looks every stored key and a few never stored up, in one lookup; the connector's counters then hold
    exactly the answer LMCache got. Returns (found, asked)."""
    keys = fill(c) + NEVER
    before = c.conn.stats()
    assert before["lookup_hits"] == 0 and before["lookup_misses"] == 0, before
    ok, err, per_key = c.exists(keys)
    assert ok, err
    found = sum(per_key)
    card = card_stats()
    assert card["evicted_objects"] > 0, f"the card did not evict: {card['evicted_objects']}"
    assert 0 < found <= STORED - card["evicted_objects"], (found, card["evicted_objects"])
    st = c.conn.stats()
    assert st["lookup_hits"] + st["lookup_misses"] == len(keys), st
    assert st["lookup_hits"] == found and st["lookup_misses"] >= card["evicted_objects"] + len(NEVER), st
    # The load ratio cannot see it: no load was made.
    assert st["hits"] == 0 and st["misses"] == 0, st
    return found, len(keys)


def test_embedded_lookups_count_evicted_keys_as_misses(tmp_path):
    c = RawConnector(ADPConnector(card=str(tmp_path / "c.img"), card_size_gb=0.0625, num_workers=2))
    try:
        found, asked = check_lookups(c, c.conn.stats)
        assert c.conn.stats()["objects"] == found  # every key on the card was found, every other one missed
        row = rows(format_status(c.conn.stats()))["lookup hits / misses"]
        assert row == (f"{found} / {asked - found} keys (hit ratio {found / asked:.1%}; evicted keys are misses)"), row
        assert list(rows(format_status(c.conn.stats()))).index("lookup hits / misses") < list(
            rows(format_status(c.conn.stats()))
        ).index("load hits / misses")
    finally:
        c.conn.close()


def test_lookups_through_a_gateway_are_counted_by_the_connector_and_the_gateway():
    with temp_gateway(card_size_gb=0.0625) as gw:
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=20000))
        try:
            found, asked = check_lookups(c, lambda: read_gateway_stats(gw.unix_url))
            # The gateway counts every key asked of it, by all its clients: a second connector's lookup adds to it.
            g = read_gateway_stats(gw.unix_url)
            assert (g["lookup_hits"], g["lookup_misses"]) == (found, asked - found), g
            other = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1))
            try:
                ok, _, per_key = other.exists([f"lk@{STORED - 1}", "never@x"])
                assert ok and per_key == [True, False]
                assert (other.conn.stats()["lookup_hits"], other.conn.stats()["lookup_misses"]) == (1, 1)
            finally:
                other.conn.close()
            g = read_gateway_stats(gw.unix_url)
            assert (g["lookup_hits"], g["lookup_misses"]) == (found + 1, asked - found + 1), g
            assert (c.conn.stats()["lookup_hits"], c.conn.stats()["lookup_misses"]) == (found, asked - found)
            assert rows(format_status(g))["lookup hits / misses"].startswith(f"{found + 1} / {asked - found + 1} keys")
        finally:
            c.conn.close()


def test_a_failed_lookup_counts_in_neither():
    """LMCache reads a failed lookup as all misses; it is no answer about the card, so it is not counted."""
    with tempfile.TemporaryDirectory(prefix="adplk-", dir="/tmp") as d:
        c = RawConnector(ADPConnector(gateway=f"unix://{d}/none.sock", num_workers=1, timeout_ms=2000))
        try:
            ok, err, _ = c.exists(["a", "b", "c"])
            assert not ok and "lookup of key" in err, err
            st = c.conn.stats()
            assert (st["lookup_hits"], st["lookup_misses"]) == (0, 0), st
        finally:
            c.conn.close()


@pytest.mark.parametrize("where", ["embedded", "gateway"])
def test_prometheus_serves_the_lookup_counters(tmp_path, where):
    port = free_port()
    if where == "embedded":
        c = RawConnector(ADPConnector(card=str(tmp_path / "c.img"), card_size_gb=0.0625, metrics_port=port))
        ok, _, _ = c.set(["p@1"], [memoryview(payload("p@1", 4096))])
        assert ok
        assert c.exists(["p@1", "p@2", "p@3"])[0]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        c.conn.close()
    else:
        with temp_gateway(card_size_gb=0.0625, extra=("--metrics-port", str(port))) as gw:
            c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1))
            ok, _, _ = c.set(["p@1"], [memoryview(payload("p@1", 4096))])
            assert ok
            assert c.exists(["p@1", "p@2", "p@3"])[0]
            c.conn.close()
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert re.search(r"^lmcache_adp_lookup_hits_total 1\.0$", text, re.MULTILINE), text
    assert re.search(r"^lmcache_adp_lookup_misses_total 2\.0$", text, re.MULTILINE), text
