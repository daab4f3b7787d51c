# SPDX-License-Identifier: Apache-2.0
"""Prometheus metrics and a health endpoint for a card store (embedded
connector or gateway), served with prometheus_client from a daemon thread.

    GET /metrics   Prometheus text format: every stat of docs/stats.md the stats carry
    GET /health    200 {"healthy": true} / 503 {"healthy": false, ...}
    GET /stats     the raw stats as JSON (read by `lmcache-adp status --url`)

Unhealthy (503) while the card fails I/O (healthy 0: kFailingHold) or, for a connector
on a gateway, while its gateway cannot be reached (`gateway_reachable` 0:
every load a miss, every store dropped), is stalled (`gateway_stalled` 1: a
request waited gateway_stall_s with nothing heard) or answers with its card's I/O errors
(`gateway_card_healthy` 0).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from lmcache_adp._native import card_image_space
from lmcache_adp.config import amount
from lmcache_adp.log import get_logger
from lmcache_adp.stats_catalog import COUNTER, SOURCES, STATS

logger = get_logger()

StatsFn = Callable[[], dict[str, Any]]


def latency_buckets(buckets: list[int]) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets (upper bounds in seconds) from log2 microsecond buckets."""
    out, total = [], 0
    for i, n in enumerate(buckets):
        total += n
        out.append((repr(2.0 ** (i + 1) / 1e6), float(total)))
    out.append(("+Inf", float(total)))
    return out


class StatsCollector:
    def __init__(self, stats_fn: StatsFn, source: str):
        self._stats_fn = stats_fn
        self._source = source

    def collect(self):
        """One family per stat of lmcache_adp/stats_catalog.py the source reports (docs/stats.md,
        "reported by"): not the card's list's keys it only carries at their first value (a client's
        capacity_bytes 0, healthy true), which would read as a card's."""
        st = self._stats_fn()
        for stat in STATS:
            if self._source not in stat.reported_by:
                continue
            family = CounterMetricFamily if stat.kind == COUNTER else GaugeMetricFamily
            samples = list(stat.samples(st))
            if not samples:
                continue
            m = family(stat.metric, stat.meaning, labels=stat.labels)
            for labels, value in samples:
                m.add_metric(labels, value)
            yield m
        lat = st.get("latency_us_log2")
        if lat:
            h = HistogramMetricFamily(
                "lmcache_adp_op_latency_seconds", "Submit-to-completion latency of connector operations", labels=["op"]
            )
            for op, snap in lat.items():
                h.add_metric([op], latency_buckets(snap["buckets"]), sum_value=snap["sum_us"] / 1e6)
            yield h


def card_filesystem_full(path: str) -> str | None:
    """Why a failing card image fails, when its filesystem cannot hold it (the card's own size exceeds what its
    filesystem allocated to it plus the free bytes): its stores fail with ENOSPC, which the card does not read
    as being full (it does not evict for it). None for a block device, or an image that fits."""
    space = card_image_space(path) if path else None
    if space is None or space[0] <= space[1] + space[2]:
        return None
    size, allocated, free = space
    return (
        f"the card image's filesystem is full: {path} is {amount(size)}, {amount(allocated)} of it written, "
        f"{amount(free)} free on its filesystem; stores fail with 'No space left on device' (the card does not "
        "evict for it) until space is made there"
    )


UNTIL_CONNECTED = "loads miss and stores are dropped until a connect succeeds"
REFUSED = "gateway refused: "  # the connector's words for the gateway's Error frame (src_cpp/transport)


def gateway_not_reached(gateway: str, error: str) -> str:
    """Why a connector does not reach its gateway, from its gateway_error: a gateway that answers and refuses it
    (a ring_mb above the gateway's --max-ring-mb, too many clients, another protocol version) is not "unreachable".
    Without the stat (a connector of an older release) it says where the reason is."""
    if error.startswith(REFUSED):
        return f"{gateway} answers but refuses this connector: {error.removeprefix(REFUSED)}"
    if error:
        return f"{gateway} unreachable: {error}"
    return (
        f"{gateway} unreachable: not answering, or refusing this connector (the connector's WARNING in this "
        "server's log gives the reason, such as a ring_mb above the gateway's --max-ring-mb)"
    )


def health(st: dict[str, Any]) -> dict[str, Any]:
    """/health's body from a stats dict: healthy unless the card fails I/O (healthy 0) or (a connector
    on a gateway, whose stats carry gateway_reachable) the gateway cannot be reached, is stalled or answers
    with its card's I/O errors; `reasons` says why not."""
    reasons = []
    if not st.get("healthy", False):
        reasons.append("the card fails I/O (an error, and no I/O succeeded 10 s or more after the last one)")
        if "gateway_reachable" not in st and (full := card_filesystem_full(st.get("card") or "")):
            reasons.append(full)
    doc: dict[str, Any] = {"io_errors": st.get("io_errors", 0)}
    if "gateway_reachable" in st:
        doc["gateway_reachable"] = bool(st["gateway_reachable"])
        gateway = f"gateway {st['card']}" if st.get("card") else "the gateway"
        doc["gateway_token_refused"] = bool(st.get("gateway_token_refused", False))
        if doc["gateway_token_refused"]:  # does not heal by itself (audit 12 note 22)
            reasons.append(
                f"{gateway} refused this connector's token: adapter_params token_file does not hold the gateway's "
                "token; fix it and restart this process (loads miss and stores are dropped until then)"
            )
        elif not doc["gateway_reachable"]:
            # Not only "down": a running gateway that refuses this connector (a ring_mb above its --max-ring-mb, too
            # many clients) read the same, and an operator who found it running had nowhere to look (audit 15
            # item 18): the connector's last failure (gateway_error) is the reason.
            reasons.append(f"{gateway_not_reached(gateway, st.get('gateway_error') or '')}; {UNTIL_CONNECTED}")
        doc["gateway_stalled"] = bool(st.get("gateway_stalled", False))
        if doc["gateway_stalled"]:
            reasons.append(
                f"{gateway} stalled: a request waited with no reply from it (hung or overloaded); "
                "loads and stores fail by their deadlines until it answers"
            )
        doc["gateway_card_healthy"] = bool(st.get("gateway_card_healthy", True))
        if not doc["gateway_card_healthy"]:
            reasons.append(f"{gateway}'s card fails I/O: {st.get('gateway_card_error') or 'no message'}")
    doc = {"healthy": not reasons, **doc}
    if reasons:
        doc["reasons"] = reasons
    return doc


class MetricsServer:
    """Serves /metrics and /health for stats_fn on host:port (port 0: any free port); source
    (stats_catalog's EMBEDDED, CLIENT or GATEWAY) says which stats are exported.

    Loopback by default: the endpoint has no authentication, so another
    address is the caller's explicit choice (`--metrics-host`, `metrics_host`)."""

    def __init__(self, stats_fn: StatsFn, port: int, *, source: str, host: str = "127.0.0.1", start: bool = True):
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatsCollector(stats_fn, source))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                self._answer(with_body=True)

            def do_HEAD(self):  # noqa: N802 (monitors that check with HEAD got 501: audit 13)
                self._answer(with_body=False)

            def _answer(self, *, with_body: bool) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    body, status, ctype = generate_latest(registry), 200, CONTENT_TYPE_LATEST
                elif path == "/stats":
                    body, status, ctype = json.dumps(stats_fn()).encode(), 200, "application/json"
                elif path == "/health":
                    doc = health(stats_fn())
                    body, status, ctype = json.dumps(doc).encode(), 200 if doc["healthy"] else 503, "application/json"
                else:
                    body, status, ctype = b"not found: try /metrics, /health or /stats\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def log_message(self, *args):  # one line per scrape would flood the log
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._host = host
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="lmcache-adp-metrics", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Serves the port bound in __init__. start=False there binds only: the gateway takes its port before it
        opens the card (a port taken is refused before a recovery walk; review33c C3) and serves once stats_fn
        can answer; a scrape meanwhile waits in the listen backlog."""
        self._thread.start()
        logger.info("lmcache-adp metrics on http://%s:%d/metrics (health: /health)", self._host, self.port)

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()  # waits for serve_forever: never started, it would wait for ever
        self._httpd.server_close()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
