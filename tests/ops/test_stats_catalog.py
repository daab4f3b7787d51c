# SPDX-License-Identifier: Apache-2.0
"""The stats table (lmcache_adp/stats_catalog.py, docs/stats.md) against what
an embedded connector, a gateway and a connector on it really report, and the
Prometheus families served from it."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import urllib.request
from pathlib import Path
from unittest import mock

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lmcache_adp import ADPConnector, stats_catalog
from lmcache_adp.gateway_stats import read_gateway_stats
from lmcache_adp.stats_catalog import (
    BY_KEY,
    CARD_LIST_DEFAULTS,
    CLIENT,
    COUNTER,
    EMBEDDED,
    GATEWAY,
    LOAD_PROFILE_STEPS,
    NOT_NUMERIC,
    STATS,
)
from tests.helpers import RawConnector, payload
from tests.ops.test_metrics import free_port
from tests.support.gateway import Gateway

ROOT = Path(__file__).resolve().parents[2]
CATALOG = "lmcache_adp/stats_catalog.py"

# The metric names served before stats v1 (dashboards use them): never renamed.
PRE_V1_SAMPLES = {
    EMBEDDED: [
        *(f"lmcache_adp_{n}_total" for n in ("hits", "misses", "stores", "store_failures", "deletes")),
        *(f"lmcache_adp_{n}_total" for n in ("evicted_objects", "evicted_regions", "checksum_failures")),
        *(f"lmcache_adp_{n}_total" for n in ("io_errors", "media_errors", "bytes_written", "bytes_read")),
        *(f"lmcache_adp_{n}" for n in ("capacity_bytes", "used_bytes", "payload_bytes", "objects", "healthy")),
        "lmcache_adp_first_eviction_held_bytes",
        "lmcache_adp_free_regions",
        "lmcache_adp_op_latency_seconds_count",
    ],
    GATEWAY: [
        "lmcache_adp_refused_connections_total",
        "lmcache_adp_clients",
        "lmcache_adp_ring_bytes",
        "lmcache_adp_ring_used_bytes",
    ],
}


def numeric(st: dict) -> dict:
    return {k: v for k, v in st.items() if isinstance(v, (int, float))}  # bool is an int


def stats_over_http(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        return json.load(r)


def scrape(port: int) -> dict[str, tuple[str, dict[tuple, float]]]:
    """family -> (type, {labels: value}) of the samples named family or family_total."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        values = {}
        for s in fam.samples:
            if s.name in (fam.name, fam.name + "_total"):
                values[tuple(sorted(s.labels.items()))] = s.value
        out[fam.name] = (fam.type, values)
    return out


@pytest.fixture(scope="module")
def live():
    """stats dicts and metrics ports of the three sources, after stores, loads, a miss and a delete:
    {source: (stats, metrics port)}. The gateway runs with its load profile on
    (ADP_LOAD_PROFILE=1), so its benchmark-only keys are there too."""
    shm = tempfile.mkdtemp(prefix="adpst-", dir="/dev/shm")  # tmpfs: memory-speed cards
    ports = {s: free_port() for s in (EMBEDDED, CLIENT, GATEWAY)}
    gw = Gateway(os.path.join(shm, "gw"), extra=("--metrics-port", str(ports[GATEWAY])))
    conns = []
    try:
        with mock.patch.dict(os.environ, {"ADP_LOAD_PROFILE": "1"}):
            gw.start()
        emb = ADPConnector(card=os.path.join(shm, "card.img"), card_size_gb=0.0625, metrics_port=ports[EMBEDDED])
        conns.append(emb)
        cli = ADPConnector(gateway=gw.unix_url, num_workers=2, metrics_port=ports[CLIENT])
        conns.append(cli)
        for c in conns:
            raw = RawConnector(c)
            keys = [f"k{i}" for i in range(4)]
            assert raw.set(keys, [memoryview(payload(k, 300_000)) for k in keys])[0]
            raw.get([*keys, "absent"], [memoryview(bytearray(300_000)) for _ in range(5)])
            raw.delete(keys[:1])
        yield {
            EMBEDDED: (emb.stats(), ports[EMBEDDED]),
            CLIENT: (cli.stats(), ports[CLIENT]),
            GATEWAY: (read_gateway_stats(gw.unix_url), ports[GATEWAY]),
        }
    finally:
        for c in conns:
            c.close()
        if gw.proc:
            assert gw.stop() == 0
        shutil.rmtree(shm, ignore_errors=True)


def test_docs_stats_md_is_the_catalog():
    doc = (ROOT / "docs" / "stats.md").read_text()
    assert doc == stats_catalog.render_markdown(), (
        f"docs/stats.md is not {CATALOG}'s table: run `python scripts/render_stats_md.py`"
    )


@pytest.mark.parametrize("source", [EMBEDDED, CLIENT, GATEWAY])
def test_every_stat_reported_is_in_the_catalog(live, source):
    st = live[source][0]
    for k, v in st.items():
        if not isinstance(v, (int, float)):
            assert k in NOT_NUMERIC, (
                f"{source} reports {k!r} ({type(v).__name__}): a number, or NOT_NUMERIC in {CATALOG}"
            )
    unknown = sorted(set(numeric(st)) - set(BY_KEY))
    steps = [k for k in unknown if k.startswith("load_profile_")]
    assert not steps, f"the {source} reports {steps}: add their step to LOAD_PROFILE_STEPS in {CATALOG}"
    assert not unknown, (
        f"the {source} reports {unknown}, not in {CATALOG}: add a Stat row to STATS (name, kind, unit, "
        f"reported_by, meaning), then `python scripts/render_stats_md.py`"
    )
    expected = stats_catalog.expected_keys(source, load_profile=source == GATEWAY)
    missing = sorted(expected - set(st))
    assert not missing, f"{CATALOG} says the {source} reports {missing}, it does not: fix their reported_by"
    extra = sorted(set(numeric(st)) - expected)
    assert not extra, f"the {source} reports {extra}, which {CATALOG} does not give it: add it to their reported_by"
    # The card's list is in every dict; a source that does not report one of them holds its value before any event.
    for k, default in CARD_LIST_DEFAULTS.items():
        if source not in BY_KEY[k].reported_by:
            assert st[k] == default, f"the {source} reports {k}={st[k]}; {CATALOG} says it does not report it"


def test_every_catalog_entry_is_reported(live):
    reported = set().union(*(numeric(st) for st, _ in live.values()))
    silent = sorted(set(BY_KEY) - reported)
    assert not silent, f"{silent} are in {CATALOG} but reported by none: remove them, their names to RETIRED"
    for s in STATS:
        assert s.kind in (COUNTER, stats_catalog.GAUGE) and s.unit and s.meaning and s.reported_by, s
    metrics = [s.metric for s in STATS]
    shared = sorted({m for m in metrics if metrics.count(m) > 1})
    assert not shared, f"more than one stat is served as {shared}: give each its own metric_name"
    reused = sorted(set(stats_catalog.RETIRED) & set(BY_KEY))
    assert not reused, f"{reused} are retired names: a retired name is never reused"


def test_gateway_stats_fit_a_stats_reply(live):
    """Every stat, the load profile's included, fits StatsReply's bound with room for as many again."""
    from lmcache_adp import _native

    size = len(json.dumps(live[GATEWAY][0]))
    assert 2 * size < _native.MAX_STATS_BYTES, f"the gateway's stats take {size} of {_native.MAX_STATS_BYTES} bytes"


def served_as(s: stats_catalog.Stat, st: dict) -> dict[tuple, float]:
    """What /metrics should serve for stat s from the stats st: {labels: value}, nanoseconds as seconds."""
    out = {}
    for step in LOAD_PROFILE_STEPS if "{step}" in s.name else [None]:
        key = s.name.format(step=step) if step else s.name
        if key in st:
            out[(("step", step),) if step else ()] = float(st[key]) / (1e9 if key.endswith("_ns") else 1)
    return out


@pytest.mark.parametrize("source", [EMBEDDED, CLIENT, GATEWAY])
def test_metrics_serve_every_stat(live, source):
    """Each stat the source reports is a family of its kind on /metrics, with the stat's value (nanoseconds
    as seconds), read while the two /stats reads around the scrape agree on it; no other stat is."""
    port = live[source][1]
    before, families, after = stats_over_http(port), scrape(port), stats_over_http(port)
    assert numeric(before).keys() == numeric(live[source][0]).keys()
    for s in STATS:
        want = served_as(s, before)
        if source not in s.reported_by:  # e.g. a client's capacity_bytes: 0, not a card's
            assert s.metric not in families, f"{s.metric}: served by the {source}, which does not report it"
            continue
        assert want or s.only_with, f"{s.name}: the {source} reports it ({CATALOG}), its /stats lacks it"
        assert s.metric in families, f"{s.name} ({source}): no family {s.metric} on /metrics"
        assert s.metric.endswith("_seconds") == s.name.endswith("_ns") or s.unit == "seconds", s.metric
        kind, got = families[s.metric]
        assert kind == s.kind, f"{s.metric} is a {kind}, {CATALOG} says {s.kind}"
        assert got.keys() == want.keys(), (s.metric, got, want)
        if served_as(s, after) == want:
            for labels, value in want.items():
                assert got[labels] == pytest.approx(value), f"{s.metric}{labels}: {got[labels]}, /stats {value}"
    served = {name + suffix for name in families for suffix in ("", "_total", "_count")}
    for name in PRE_V1_SAMPLES.get(source, []):
        assert name in served, f"{name} is no longer served ({source}): dashboards read it"


def test_docs_name_only_served_metrics():
    """Every lmcache_adp_* name in README.md and docs/ is one /metrics serves (the catalog's, or the
    latency histogram's series)."""
    served = {"lmcache_adp_op_latency_seconds" + x for x in ("", "_bucket", "_count", "_sum")}
    served |= {s.metric + ("_total" if s.kind == COUNTER else "") for s in STATS}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        named = set(re.findall(r"lmcache_adp_[a-z_]+", doc.read_text()))
        unknown = sorted(named - served - {"lmcache_adp_"})
        assert not unknown, f"{doc.relative_to(ROOT)} names {unknown}, which /metrics does not serve"
