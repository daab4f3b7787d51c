# SPDX-License-Identifier: Apache-2.0
"""The metrics endpoint of an embedded connector: scrape, parse, counters move."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lmcache_adp import ADPConnector
from tests.gateway.conftest import workdir  # noqa: F401 (a fixture)
from tests.helpers import RawConnector, payload
from tests.support.gateway import Gateway


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


@pytest.fixture
def served(card):
    port = free_port()
    c = ADPConnector(card=card, card_size_gb=0.0625, metrics_port=port)
    yield RawConnector(c), port
    c.close()


def test_counters_move_with_traffic(served):
    c, port = served
    before = scrape(port)
    assert before["lmcache_adp_stores_total"] == 0 and before["lmcache_adp_healthy"] == 1
    keys = [f"k{i}" for i in range(5)]
    c.set(keys, [memoryview(payload(k, 50000)) for k in keys])
    c.get(keys + ["absent"], [memoryview(bytearray(50000)) for _ in range(6)])
    after = scrape(port)
    assert after["lmcache_adp_stores_total"] == 5
    assert after["lmcache_adp_hits_total"] == 5 and after["lmcache_adp_misses_total"] == 1
    assert after["lmcache_adp_objects"] == 5
    assert after["lmcache_adp_bytes_written_total"] >= 5 * 50000
    assert after["lmcache_adp_bytes_read_total"] >= 5 * 50000
    assert after["lmcache_adp_op_latency_seconds_count{op=set}"] == 1
    assert after["lmcache_adp_op_latency_seconds_count{op=get}"] == 1
    assert after["lmcache_adp_op_latency_seconds_bucket{le=+Inf,op=get}"] == 1


def test_health_and_stats_endpoints(served, card):
    c, port = served
    c.set(["a"], [memoryview(payload("a", 300_000))])
    health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5))
    assert health["healthy"] is True
    stats = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5))
    assert stats["objects"] == 1 and stats["card"] == card
    size = os.path.getsize(card)
    os.truncate(card, 1 << 20)  # the card fails I/O
    c.get(["a"], [memoryview(bytearray(300_000))])
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    assert e.value.code == 503 and json.load(e.value)["healthy"] is False
    os.truncate(card, size)


def test_head_requests_answer_as_get_without_a_body(served):
    """Audit 13: a monitor that checks with HEAD (`curl -I`, uptime checkers) got 501 Unsupported method from
    every page, healthy or not. Now the GET's status and headers, no body."""
    _, port = served
    for page, ctype in (("/health", "application/json"), ("/metrics", "text/plain"), ("/stats", "application/json")):
        get = urllib.request.urlopen(f"http://127.0.0.1:{port}{page}", timeout=5)
        head = urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{port}{page}", method="HEAD"), timeout=5
        )
        assert head.status == 200 and head.headers["Content-Type"].startswith(ctype), (page, head.headers)
        assert int(head.headers["Content-Length"]) > 0 and head.read() == b"", page
        assert get.status == 200
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/nope", method="HEAD"), timeout=5)
    assert e.value.code == 404


def test_status_reads_a_running_connector(served):
    import subprocess
    import sys

    c, port = served
    c.set(["a"], [memoryview(b"x" * 1000)])
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "status", "--url", f"http://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "set latency" in r.stdout and "objects" in r.stdout


def non_loopback_address() -> str:
    """An address of this machine that is not loopback (where a 0.0.0.0 bind is reachable from the network)."""
    for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
        if not info[4][0].startswith("127."):
            return info[4][0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET: no packet is sent, the kernel only picks a source address
        return s.getsockname()[0]


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def test_metrics_bind_loopback_unless_told(card):
    """The endpoint has no authentication: by default only this host reaches it;
    metrics_host widens it on purpose."""
    other = non_loopback_address()
    assert not other.startswith("127."), other
    port = free_port()
    c = ADPConnector(card=card, card_size_gb=0.0625, metrics_port=port)
    try:
        assert reachable("127.0.0.1", port)
        assert not reachable(other, port), f"metrics on {other}:{port} without being asked"
    finally:
        c.close()
    port = free_port()
    c = ADPConnector(card=card, metrics_port=port, metrics_host="0.0.0.0")
    try:
        assert reachable(other, port) and scrape(port)["lmcache_adp_healthy"] == 1
    finally:
        c.close()


def test_metrics_host_validated():
    from lmcache_adp import ConfigError

    with pytest.raises(ConfigError, match=r"adapter_params\['metrics_host'\] applies only with a metrics_port"):
        ADPConnector(metrics_host="0.0.0.0")
    with pytest.raises(ConfigError, match=r"adapter_params\['metrics_host'\] must be an address"):
        ADPConnector(metrics_port=9400, metrics_host="")


def test_metrics_port_validated():
    from lmcache_adp import ConfigError

    with pytest.raises(ConfigError, match=r"adapter_params\['metrics_port'\] must be in \[0, 65535\]"):
        ADPConnector(metrics_port=70000)


def test_metrics_port_in_use_is_one_clear_line_and_frees_the_card(card):
    """A metrics_port another process holds failed the connector with a bare "[Errno 98] Address already in
    use", naming no parameter, and left the card locked until the half-built object was collected (audit 12).
    The image that start created is removed (as a failed gateway start's is: tests/connector's
    test_a_failed_start_removes_only_the_image_it_created); an existing card stays, and is free at once."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as e:
            ADPConnector(card=card, card_size_gb=0.0625, metrics_port=port)
        msg = str(e.value)
        assert f"adapter_params['metrics_port'] {port} on metrics_host '127.0.0.1'" in msg, msg
        assert "Address already in use" in msg, msg
        # Who may hold it, as the gateway's refusal says (review33c C4: the connector's ended at "in use").
        assert msg.endswith(
            "Address already in use (another process holds the port: another connector's metrics_port or a "
            "gateway's --metrics-port; give each its own)"
        ), msg
        assert not os.path.exists(card)  # this start's image: removed
        ADPConnector(card=card, card_size_gb=0.0625).close()
        with pytest.raises(RuntimeError, match="Address already in use"):
            ADPConnector(card=card, metrics_port=port)
        assert os.path.exists(card)  # there before the start: kept
        ADPConnector(card=card).close()  # the card is free at once (no "already open by another connector")


# The start of a script that gets hold of the object a failed start leaves behind, as a debugger, pytest's
# report or an error reporter showing locals does: ADPConnector.__init__'s self, in the traceback's frames.
LEFT_BEHIND = """
from lmcache_adp import ADPConnector, ConfigError

def left_behind(params):
    try:
        ADPConnector(**params)
    except (RuntimeError, ConfigError) as e:
        tb, frames = e.__traceback__, []
        while tb:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        return next(f.f_locals["self"] for f in frames if "self" in f.f_locals)
    raise AssertionError(f"ADPConnector(**{params}) started")
"""


def test_a_connector_that_did_not_start_has_a_safe_repr(card):
    """repr() of the object left behind by a failed start (in the traceback's frames: pytest's report, a debugger,
    an error reporter showing locals) was a segmentation fault: describe() on a native part never built."""
    script = (
        LEFT_BEHIND
        + f"""
held = ADPConnector(card={card!r}, card_size_gb=0.0625)
for params in ({{"card": {card!r}}}, {{"card": {card!r}, "num_workers": 0}}):
    print(repr(left_behind(params)), flush=True)
print(repr(held)[:13])
held.close()
"""
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["ADPConnector(not started)"] * 2 + ["ADPConnector("], r.stdout


def test_every_method_of_a_connector_that_did_not_start_raises(card):
    """Each method of the object left behind by a failed start read memory never set up (the C++ part was
    never built; audit 12 note 3): a submit, stats() or event_fd() on it could crash the process. Now each
    raises RuntimeError naming why the start failed, and close() does nothing. In a subprocess: a crash is
    this test failing, not pytest dying."""
    script = (
        LEFT_BEHIND
        + f"""
held = ADPConnector(card={card!r}, card_size_gb=0.0625)
calls = {{
    "event_fd": (), "submit_batch_get": (["k"], [bytearray(8)]), "submit_batch_set": (["k"], [b"v"]),
    "submit_batch_exists": (["k"],), "submit_batch_delete": (["k"],), "drain_completions": (), "stats": (),
    "describe": (),
}}
for params in ({{"card": {card!r}}}, {{"card": {card!r}, "num_workers": 0}}, {{"card": "/proc/adp-no.img", "card_size_gb": 1}}):
    obj = left_behind(params)
    for name, args in calls.items():
        try:
            getattr(obj, name)(*args)
            print(name, "returned", flush=True)
        except RuntimeError as e:
            print(name, "raised", e, flush=True)
    obj.close()
    obj.close()
    print("closed", repr(obj), flush=True)
held.close()
"""
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"rc {r.returncode}: {r.stdout[-1000:]} {r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    assert len(lines) == 3 * 9, r.stdout
    whys = (
        "already open",
        "num_workers",
        "card /proc/adp-no.img",
    )  # its lock, a parameter, a path (fb4626e: now refused at its open)
    for i, why in enumerate(whys):
        said = lines[9 * i : 9 * i + 8]
        for line in said:
            assert " raised this connector failed to start: " in line and why in line, line
        assert lines[9 * i + 8] == "closed ADPConnector(not started)", lines[9 * i + 8]


def test_status_url_as_an_operator_writes_it(card, capsys):
    """`status --url` took only http://HOST:PORT: HOST:PORT was 'unknown url type', .../metrics was
    .../metrics/stats (404), and a server that is not ours (an HTML or text /stats) was a JSONDecodeError
    traceback, a malformed URL a ValueError one (audit 12)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from lmcache_adp.cli import main

    port = free_port()
    c = ADPConnector(card=card, card_size_gb=0.0625, metrics_port=port)
    try:
        for url in (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}/metrics", f"http://127.0.0.1:{port}/health/"):
            assert main(["status", "--url", url, "--json"]) == 0, capsys.readouterr().err
            assert json.loads(capsys.readouterr().out)["card"] == card
    finally:
        c.close()

    class NotOurs(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            body = b"<html>LMCache</html>" if self.path == "/stats" else b"no"
            self.send_response(200 if self.path == "/stats" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), NotOurs)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        hint = "is it the metrics port of lmcache-adp (adapter_params metrics_port, gateway --metrics-port)?"
        for url, says in (
            (f"http://127.0.0.1:{other.server_port}", "Expecting value"),
            (f"http://127.0.0.1:{other.server_port}/x", "HTTP 404"),
            ("http://[bad", "Invalid IPv6 URL"),
        ):
            assert main(["status", "--url", url]) == 3
            err = capsys.readouterr().err
            assert err.startswith("lmcache-adp: error: cannot read ") and says in err and hint in err, err
    finally:
        other.shutdown()


def test_gateway_serves_metrics_with_clients(workdir):
    port = free_port()
    gw = Gateway(workdir, extra=("--metrics-port", str(port))).start()
    try:
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2))
        keys = [f"g{i}" for i in range(4)]
        assert c.set(keys, [memoryview(payload(k, 40000)) for k in keys])[0]
        m = scrape(port)
        assert m["lmcache_adp_stores_total"] == 4 and m["lmcache_adp_objects"] == 4
        assert m["lmcache_adp_clients"] >= 1 and m["lmcache_adp_healthy"] == 1
        assert m["lmcache_adp_ring_bytes"] >= 64 << 20  # a 64 MiB ring per connection
        assert m["lmcache_adp_ring_used_bytes"] == 0  # nothing in flight between batches
        import subprocess
        import sys

        r = subprocess.run(
            [sys.executable, "-m", "lmcache_adp.cli", "status", "--url", f"http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0 and "connected clients" in r.stdout
        c.conn.close()
    finally:
        assert gw.stop() == 0


def test_gateway_metrics_port_checked(workdir):
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmcache_adp.cli",
            "gateway",
            "--card",
            f"{workdir}/c.img",
            "--socket",
            f"{workdir}/s.sock",
            "--metrics-port",
            "70000",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--metrics-port must be in [0, 65535]" in r.stderr
