# SPDX-License-Identifier: Apache-2.0
"""Prometheus metrics and a health endpoint for a card store (embedded
connector or gateway), served with prometheus_client from a daemon thread.

    GET /metrics   Prometheus text format
    GET /health    200 {"healthy": true} / 503 {"healthy": false, ...}
    GET /stats     the raw stats as JSON (read by `lmcache-adp status --url`)

The card is unhealthy while its most recent I/O failed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from lmcache_adp.log import get_logger

logger = get_logger()

StatsFn = Callable[[], dict[str, Any]]

COUNTERS = {
    "hits": "Loads served from the card",
    "misses": "Loads of keys the card does not hold (or failed checks)",
    "stores": "Objects stored",
    "store_failures": "Objects that could not be stored",
    "deletes": "Objects deleted on request",
    "evicted_objects": "Objects evicted to make room",
    "evicted_regions": "Regions evicted to make room",
    "checksum_failures": "Objects that failed their checksum on read (dropped)",
    "io_errors": "Card I/O errors",
    "media_errors": "Regions found unreadable at open (objects past the damage lost; the rest served)",
    "bytes_written": "Bytes written to the card",
    "bytes_read": "Bytes read from the card",
    "refused_connections": "Connections the gateway refused by a limit (gateway)",
}
GAUGES = {
    "capacity_bytes": "Bytes the card can hold",
    "used_bytes": "Bytes of the card held by live objects",
    "payload_bytes": "Payload bytes of the objects held (used_bytes less headers and padding)",
    "first_eviction_held_bytes": "Payload held at the first eviction since open, stores then in flight included",
    "objects": "Objects on the card",
    "free_regions": "Regions not holding objects",
    "healthy": "1 while the card's most recent I/O succeeded",
    "clients": "Connected clients (gateway)",
    "ring_bytes": "Bytes of the connected clients' shared-memory rings (gateway)",
    "ring_used_bytes": "Payload bytes of batches in progress in those rings (gateway)",
}


def latency_buckets(buckets: list[int]) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets (upper bounds in seconds) from log2 microsecond buckets."""
    out, total = [], 0
    for i, n in enumerate(buckets):
        total += n
        out.append((repr(2.0 ** (i + 1) / 1e6), float(total)))
    out.append(("+Inf", float(total)))
    return out


class StatsCollector:
    def __init__(self, stats_fn: StatsFn):
        self._stats_fn = stats_fn

    def collect(self):
        st = self._stats_fn()
        for name, doc in COUNTERS.items():
            if name in st:
                yield CounterMetricFamily(f"lmcache_adp_{name}", doc, value=float(st[name]))
        for name, doc in GAUGES.items():
            if name in st:
                yield GaugeMetricFamily(f"lmcache_adp_{name}", doc, value=float(st[name]))
        lat = st.get("latency_us_log2")
        if lat:
            h = HistogramMetricFamily(
                "lmcache_adp_op_latency_seconds", "Submit-to-completion latency of connector operations", labels=["op"]
            )
            for op, snap in lat.items():
                h.add_metric([op], latency_buckets(snap["buckets"]), sum_value=snap["sum_us"] / 1e6)
            yield h


class MetricsServer:
    """Serves /metrics and /health for stats_fn on host:port (port 0: any free port).

    Loopback by default: the endpoint has no authentication, so another
    address is the caller's explicit choice (`--metrics-host`, `metrics_host`)."""

    def __init__(self, stats_fn: StatsFn, port: int, host: str = "127.0.0.1"):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatsCollector(stats_fn))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                path = self.path.split("?")[0]
                if path == "/metrics":
                    body, status, ctype = generate_latest(registry), 200, CONTENT_TYPE_LATEST
                elif path == "/stats":
                    body, status, ctype = json.dumps(stats_fn()).encode(), 200, "application/json"
                elif path == "/health":
                    st = stats_fn()
                    healthy = bool(st.get("healthy", False))
                    doc = {"healthy": healthy, "io_errors": st.get("io_errors", 0)}
                    body, status, ctype = json.dumps(doc).encode(), 200 if healthy else 503, "application/json"
                else:
                    body, status, ctype = b"not found: try /metrics, /health or /stats\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # one line per scrape would flood the log
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="lmcache-adp-metrics", daemon=True)
        self._thread.start()
        logger.info("lmcache-adp metrics on http://%s:%d/metrics (health: /health)", host, self.port)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
