# SPDX-License-Identifier: Apache-2.0
"""A connector on a gateway with a metrics port: /health and gateway_reachable
say whether its gateway can be reached (README "Operations", docs/stats.md)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import resource
import shutil
import socket
import struct
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from lmcache_adp import ADPConnector
from lmcache_adp._native import FEATURE_ALIVE, FEATURE_RING_PROGRESS, FRAME_TYPES
from lmcache_adp.gateway_stats import read_gateway_stats
from lmcache_adp.ops import format_status
from tests.gateway import wire
from tests.gateway.test_failures import keys_and_datas
from tests.gateway.test_process_memory import PIECE as PM_PIECE
from tests.gateway.test_process_memory import SIZE as PM_SIZE
from tests.gateway.test_process_memory import ProcessClient
from tests.gateway.test_process_memory import store as pm_store
from tests.gateway.test_ring_pieces import CONTROL, MIB
from tests.gateway.test_ring_pieces import RawClient as RingClient
from tests.helpers import RawConnector, eventually, payload
from tests.ops.test_metrics import free_port, scrape
from tests.support.gateway import TOKEN, Gateway


def health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def metrics_connector(gw: Gateway, timeout_ms: int, **params) -> tuple[ADPConnector, RawConnector, int]:
    """A one-worker connector on gw's Unix socket with a metrics port of its own (/health): it, its RawConnector
    and the port."""
    port = free_port()
    conn = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=timeout_ms, metrics_port=port, **params)
    return conn, RawConnector(conn), port


def store_until_ok(c: RawConnector, keys: list[str], datas: list[bytes], gw: Gateway, why: str) -> None:
    """Stores again until a store succeeds; `why` fails it after 10 s (the connector reconnects with
    back-off, at most 2 s apart)."""
    deadline = time.monotonic() + 10
    while not c.set(keys, [memoryview(d) for d in datas])[0]:
        assert time.monotonic() < deadline, f"{why}:\n" + gw.log()
        time.sleep(0.1)


def test_health_follows_the_gateway(workdir):
    gw = Gateway(workdir).start()
    # One worker: one connection, so the batches below are the ones that find the gateway gone and back.
    conn, c, port = metrics_connector(gw, timeout_ms=2000)
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
        store_until_ok(c, keys, datas, gw, "connector did not reconnect")
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


# The stall bound in these tests (adapter_params gateway_stall_s; 5 s by default).
STALL_MS = 1000
STALL_S = STALL_MS / 1000


def wait_health(port: int, code: int, within: float) -> dict:
    """Polls /health until it answers `code`; fails after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        got, doc = health(port)
        if got == code:
            return doc
        assert time.monotonic() < deadline, f"/health still {got} after {within} s: {doc}"
        time.sleep(0.05)


def stalled_connector(workdir, timeout_ms: int, tcp: bool = False):
    gw = Gateway(workdir, tcp=tcp).start()
    port = free_port()
    where = {"gateway": gw.tcp_url, "token_file": gw.token_file} if tcp else {"gateway": gw.unix_url}
    conn = ADPConnector(num_workers=1, timeout_ms=timeout_ms, metrics_port=port, gateway_stall_s=STALL_S, **where)
    return gw, conn, RawConnector(conn), port


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_stopped_gateway_is_stalled_until_it_answers(workdir, transport):
    """SIGSTOP with a load outstanding: 503 and gateway_stalled within the bound (the connection stays
    open: gateway_reachable is still 1); SIGCONT: the load completes (hits) and the connector is healthy.
    Over TCP too (no ring, no alive word: the request unanswered for gateway_stall_s)."""
    gw, conn, c, port = stalled_connector(workdir, timeout_ms=8000, tcp=transport == "tcp")
    try:
        keys, datas = keys_and_datas(3)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        gw.pause()
        outs = [bytearray(len(d)) for d in datas]
        t0 = time.monotonic()
        fid = conn.submit_batch_get(keys, [memoryview(o) for o in outs])
        time.sleep(STALL_MS / 2000)
        assert health(port)[0] == 200, "stalled before the bound"
        doc = wait_health(port, 503, within=STALL_MS / 1000 + 1.5)
        assert time.monotonic() - t0 >= STALL_MS / 1000, doc
        assert (doc["healthy"], doc["gateway_stalled"], doc["gateway_reachable"]) == (False, True, True), doc
        assert any(conn.stats()["card"] in r and "stalled" in r for r in doc["reasons"]), doc
        assert conn.stats()["gateway_stalled"] is True
        assert scrape(port)["lmcache_adp_gateway_stalled"] == 1
        assert "gateway stalled" in format_status(conn.stats())
        assert fid not in c.done and not conn.drain_completions(), "the load ended while the gateway was stopped"

        gw.resume()
        ok, err, per_key = c.wait(fid, timeout=5)
        assert ok and all(per_key), (err, per_key)
        assert [bytes(o) for o in outs] == datas
        doc = wait_health(port, 200, within=1)
        assert doc["gateway_stalled"] is False and "reasons" not in doc, doc
        assert scrape(port)["lmcache_adp_gateway_stalled"] == 0
    finally:
        conn.close()
        gw.resume()
        assert gw.stop() == 0


def test_a_stopped_gateway_is_stalled_though_another_worker_sends_a_request(workdir):
    """Review 32 P1: a request frame written into the socket is no sign of the gateway's life. The gateway stopped
    (SIGSTOP), worker A's load waits; 1.5 s later worker B sends a load too: its frame goes whole into the kernel's
    socket buffer, which nobody reads. The connector must read stalled gateway_stall_s (2 s) after A's wait began,
    not after B's write. Red on main 6ad33bc (9820f54 counts the bytes write_frame moves as heard): not stalled
    at 2.7 s (stalled only from about 3.5 s)."""
    stall_s = 2.0
    gw = Gateway(workdir).start()
    conn = ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=15000, gateway_stall_s=stall_s)
    try:
        c = RawConnector(conn)
        keys = ["a@0", "b@0"]
        datas = [payload(k, 1 << 16) for k in keys]
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        connect_workers(conn, gw, 2)
        gw.pause()
        outs = [bytearray(len(d)) for d in datas]
        t0 = time.monotonic()
        fa = conn.submit_batch_get(["a@0"], [memoryview(outs[0])])
        time.sleep(1.5)  # the gap under test: B's write comes this long after A's wait began
        fb = conn.submit_batch_get(["b@0"], [memoryview(outs[1])])
        seen = []
        while time.monotonic() - t0 < stall_s + 0.7:
            seen.append((round(time.monotonic() - t0, 2), conn.stats()["gateway_stalled"]))
            time.sleep(0.05)
        seen.append((round(time.monotonic() - t0, 2), conn.stats()["gateway_stalled"]))
        gw.resume()
        ra, rb = c.wait(fa, timeout=10), c.wait(fb, timeout=10)
        assert ra[0] and rb[0] and [bytes(o) for o in outs] == datas, (ra, rb)
        assert seen[-1][1] is True, str(seen)
    finally:
        conn.close()
        gw.resume()
        assert gw.stop() == 0


def test_a_load_given_up_on_a_stopped_gateway_keeps_it_stalled(workdir):
    """The load fails by its deadline (nothing hangs); the stall outlives the dropped connection until the
    gateway is heard from again (here: the next store's new connection, after SIGCONT)."""
    gw, conn, c, port = stalled_connector(workdir, timeout_ms=2000)
    try:
        keys, datas = keys_and_datas(3)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        gw.pause()
        t0 = time.monotonic()
        ok, err, _ = c.get(keys, [memoryview(bytearray(len(d))) for d in datas])
        # By its deadline: the connector's deadline thread ("timed out after 2000 ms") or the worker's wait
        # for the reply ("gateway did not answer in time"), whichever comes first.
        assert not ok and ("timed out" in err or "in time" in err) and time.monotonic() - t0 < 2 + 1, err
        time.sleep(0.2)
        code, doc = health(port)
        assert (code, doc["gateway_stalled"]) == (503, True), doc

        gw.resume()
        store_until_ok(c, keys, datas, gw, "no store after SIGCONT")
        code, doc = health(port)
        assert (code, doc["healthy"], doc["gateway_stalled"]) == (200, True, False), doc
    finally:
        conn.close()
        gw.resume()
        assert gw.stop() == 0


@pytest.mark.parametrize("gateway", ["working", "stopped"])
def test_a_load_cut_by_the_gateways_death_is_judged_by_the_alive_word_its_drop_reads(
    workdir, monkeypatch, capfd, gateway
):
    """Review r11 N2: drop() reads the dropped connection's alive word before its verdict. A load of ten objects
    at 0.3 s each (ADP_TEST_SEGMENT_WRITE_DELAY_MS: 3 s, an alive bump per object, no reply before the end) is cut
    1.5 s in by the gateway's death (SIGKILL): the wait ends on the hang-up, not at a stall check, and with those
    checks 60 s apart (ADP_TEST_STALL_CHECK_MS; 250 ms otherwise) none came before, so drop() is the only look at
    the word. The gateway was working: not stalled (the bound is 1 s), nothing logged. Stopped (SIGSTOP) before
    the load instead, it is stalled, and logged once.
    (A wait that ends at the deadline looks at the stall once more there: RemoteSession::wait_reply.)"""
    gw = Gateway(workdir, extra=("--process-write-threads", "0")).start(env={"ADP_TEST_SEGMENT_WRITE_DELAY_MS": 300})
    monkeypatch.setenv("ADP_TEST_STALL_CHECK_MS", "60000")
    conn = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=30000, gateway_stall_s=STALL_S)
    monkeypatch.delenv("ADP_TEST_STALL_CHECK_MS")
    c = RawConnector(conn)
    try:
        keys = [f"cut@{i}" for i in range(10)]
        datas = [bytearray(payload(k, 1 << 20)) for k in keys]
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        st = conn.stats()
        assert (st["process_stores"], st["gateway_stalled"]) == (10, False), st
        capfd.readouterr()
        if gateway == "stopped":
            gw.pause()
        fid = conn.submit_batch_get(keys, [memoryview(bytearray(1 << 20)) for _ in keys])
        time.sleep(1.5 * STALL_S)
        gw.kill()
        ok, err, _ = c.wait(fid, timeout=10)  # completed once the worker dropped its connection
        assert not ok, "the load ended before the gateway was killed: no verdict to look at"
        stalled = gateway == "stopped"
        assert conn.stats()["gateway_stalled"] is stalled
        assert capfd.readouterr().err.count("nothing heard from the gateway") == stalled
    finally:
        conn.close()
        if gw.proc:
            gw.resume()
            gw.kill()


def test_an_idle_connection_is_not_stalled(workdir):
    """No request outstanding: nothing to wait for, so no stall however long the connection is silent."""
    gw, conn, c, port = stalled_connector(workdir, timeout_ms=2000)
    try:
        keys, datas = keys_and_datas(2)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        time.sleep(2.5 * STALL_MS / 1000)
        code, doc = health(port)
        assert (code, doc["gateway_stalled"]) == (200, False), doc
        assert c.get(keys, [memoryview(bytearray(len(d))) for d in datas])[0]
        assert health(port)[0] == 200
    finally:
        conn.close()
        assert gw.stop() == 0


def test_the_gateways_card_failing_io(workdir, monkeypatch):
    """A load the gateway answers with its card's I/O error: /health 503 with the gateway's message
    (gateway_card_healthy 0) though the gateway is reachable; a store that succeeds: healthy again (the hold,
    kFailingHold, is 0 here: test_a_card_failing_and_working_interleaved_reads_failing_throughout has one)."""
    gw = Gateway(workdir).start(env={"ADP_TEST_CARD_FAILING_HOLD_MS": 0})
    monkeypatch.setenv("ADP_TEST_CARD_FAILING_HOLD_MS", "0")
    conn, c, port = metrics_connector(gw, timeout_ms=2000)
    size = 0
    try:
        keys, datas = keys_and_datas(3)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        size = os.path.getsize(gw.card)
        os.truncate(gw.card, 1 << 20)  # the gateway's card fails reads past 1 MiB
        ok, err, _ = c.get(keys, [memoryview(bytearray(len(d))) for d in datas])
        assert not ok and "unexpected end of card" in err, err
        code, doc = health(port)
        assert (code, doc["gateway_card_healthy"], doc["gateway_reachable"]) == (503, False, True), doc
        assert any("card fails I/O: unexpected end of card" in r for r in doc["reasons"]), doc
        st = conn.stats()
        assert st["gateway_card_healthy"] is False and "unexpected end of card" in st["gateway_card_error"], st
        assert scrape(port)["lmcache_adp_gateway_card_healthy"] == 0
        assert "FAILING I/O" in format_status(st)
        assert not c.get(keys[:1], [memoryview(bytearray(len(datas[0])))])[0]  # a miss or a failure: no change
        assert health(port)[0] == 503

        os.truncate(gw.card, size)
        size = 0
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        code, doc = health(port)
        assert (code, doc["gateway_card_healthy"]) == (200, True) and "reasons" not in doc, doc
        assert conn.stats()["gateway_card_error"] == ""
    finally:
        if size:
            os.truncate(gw.card, size)
        conn.close()
        assert gw.stop() == 0


def health_while(port: int, run) -> tuple[tuple, float, list]:
    """Runs `run` on a thread, polling /health every 100 ms meanwhile: its result, how long it took, and
    (seconds since the start, HTTP code, gateway_stalled) of each poll."""
    res: dict = {}
    t = threading.Thread(target=lambda: res.update(r=run()))
    t0 = time.monotonic()
    t.start()
    seen = []
    while t.is_alive():
        code, doc = health(port)
        seen.append((round(time.monotonic() - t0, 2), code, doc.get("gateway_stalled")))
        time.sleep(0.1)
    t.join()
    return res["r"], time.monotonic() - t0, seen


def test_a_slow_working_gateway_is_not_stalled(workdir):
    """A gateway whose card takes 0.3 s an object (ADP_TEST_SEGMENT_WRITE_DELAY_MS), storing then loading 10
    objects in one batch each (3 s, three times the bound, no reply before the end): it works, so /health stays
    200 throughout (r7: the gateway bumps the control page's alive word per item and chunk, and stats() reads
    it as heard). Review r9 H1: before, both batches read stalled from 1 s on."""
    gw = Gateway(workdir, extra=("--process-write-threads", "0")).start(env={"ADP_TEST_SEGMENT_WRITE_DELAY_MS": 300})
    conn, c, port = metrics_connector(gw, timeout_ms=30000, gateway_stall_s=STALL_S)
    try:
        keys = [f"slow@{i}" for i in range(10)]
        datas = [bytearray(payload(k, 1 << 20)) for k in keys]
        outs = [bytearray(1 << 20) for _ in keys]
        for what, run in (
            ("store", lambda: c.set(keys, [memoryview(d) for d in datas])),
            ("load", lambda: c.get(keys, [memoryview(o) for o in outs])),
        ):
            r, took, seen = health_while(port, run)
            assert r[0], (what, r)
            assert took >= 2.5 * STALL_MS / 1000, (what, took)  # long enough to have read stalled
            assert [s for s in seen if s[1] != 200] == [], (what, seen)
        assert [bytes(o) for o in outs] == [bytes(d) for d in datas]
        st = conn.stats()
        assert st["process_stores"] >= 10 and st["gateway_stalled"] is False, st
    finally:
        conn.close()
        assert gw.stop() == 0


def stall_logged_until_resumed(gw: Gateway, conn: ADPConnector, c: RawConnector, fid, capfd, paused: float) -> tuple:
    """gw stopped (pause() at `paused`, time.monotonic()) while c's load fid waits: the stall's WARNING comes once,
    not before the bound (less the 250 ms a ring piece's pause may have come before the SIGSTOP), with the load still
    waiting; then gw resumes, and the INFO that the gateway answers again comes once after the load ended. The
    load's (ok, err, per_key).
    Waits for the WARNING (the event), not a fixed bound + 0.75 s (session 28's thin margin on a loaded host): the
    load's deadline is far past the 5 s given up after, so a WARNING that came only with the load's end, a scrape or
    the resume still fails here. Then 0.5 s (two of the wait's 250 ms checks): a WARNING logged again fails below."""
    err = ""
    give_up = paused + STALL_S + 5
    while "nothing heard from the gateway" not in err:
        assert time.monotonic() < give_up, f"no stall WARNING in {STALL_S + 5} s:\n{err}"
        time.sleep(0.02)
        err += capfd.readouterr().err
    seen_s = time.monotonic() - paused
    assert seen_s >= STALL_S - 0.25, (seen_s, err)  # not before the bound
    time.sleep(0.5)
    err += capfd.readouterr().err
    assert err.count("nothing heard from the gateway") == 1 and "WARNING" in err, err
    assert fid not in c.done and not conn.drain_completions(), "the load ended while the gateway was stopped"
    gw.resume()
    res = c.wait(fid, timeout=10)
    err = capfd.readouterr().err
    assert err.count("the gateway answers again") == 1 and "nothing heard" not in err, err
    return res


def test_a_stall_is_logged_when_it_starts_without_a_scrape(workdir, capfd):
    """Review r9 H3: nothing calls stats() (no metrics port, no scrape), yet the stall's WARNING comes within the
    bound plus the wait's check interval (250 ms), once, while the load still waits; SIGCONT: the INFO that the
    gateway answers again, once."""
    gw = Gateway(workdir).start()
    conn = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=8000, gateway_stall_s=STALL_S)
    c = RawConnector(conn)
    try:
        keys, datas = keys_and_datas(3)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        capfd.readouterr()
        gw.pause()
        paused = time.monotonic()
        outs = [bytearray(len(d)) for d in datas]
        fid = conn.submit_batch_get(keys, [memoryview(o) for o in outs])
        ok, err, per_key = stall_logged_until_resumed(gw, conn, c, fid, capfd, paused)
        assert ok and all(per_key), (err, per_key)
        assert [bytes(o) for o in outs] == datas
    finally:
        conn.close()
        gw.resume()
        assert gw.stop() == 0


def test_stalls_in_a_row_log_one_warning_and_their_count_and_the_end_says_how_long(workdir, capfd, monkeypatch):
    """Review r10 N1: a gateway that answers only past the bound, stall after stall, logs one WARNING per
    ADP_TEST_STALL_LOG_INTERVAL_MS (here 5 s; kStallLogInterval, 60 s, otherwise), not a pair per stall. Stall 1
    (SIGSTOP for the bound + 0.75 s under a load): a WARNING, and an INFO saying how long it lasted. Stall 2 right
    after: no line. Stall 3 once the interval has passed: a WARNING that counts stall 2 and its time."""
    gw = Gateway(workdir).start()
    monkeypatch.setenv("ADP_TEST_STALL_LOG_INTERVAL_MS", "5000")
    conn = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=8000, gateway_stall_s=STALL_S)
    monkeypatch.delenv("ADP_TEST_STALL_LOG_INTERVAL_MS")
    c = RawConnector(conn)

    def stall() -> str:
        """One stall of 0.5 s or more from its being seen, ended by the load's reply; the lines logged."""
        capfd.readouterr()
        gw.pause()
        outs = [bytearray(len(d)) for d in datas]
        fid = conn.submit_batch_get(keys, [memoryview(o) for o in outs])
        # The stall seen (the connector's flag; stats() looks too), then 0.5 s more: it lasts >= 0.5 s from its
        # being seen whatever the load (session 28: a fixed bound + 0.75 s left `lasted` to the scheduler).
        assert eventually(lambda: conn.stats()["gateway_stalled"] is True, STALL_S + 5), "no stall seen"
        time.sleep(0.5)
        gw.resume()
        ok, err, per_key = c.wait(fid, timeout=5)
        assert ok and all(per_key) and [bytes(o) for o in outs] == datas, (err, per_key)
        assert conn.stats()["gateway_stalled"] is False
        return capfd.readouterr().err

    try:
        keys, datas = keys_and_datas(3)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        err = stall()
        t1 = time.monotonic()  # stall 1's WARNING was logged before its reply: the interval began before t1
        assert err.count("nothing heard from the gateway") == 1 and "not logged" not in err, err
        lasted = re.findall(r"the gateway answers again, ([0-9.]+) s after the stall was seen", err)
        assert len(lasted) == 1 and 0.5 <= float(lasted[0]) <= 2, err

        err = stall()  # within 5 s of the first WARNING
        assert "nothing heard" not in err and "answers again" not in err, err

        time.sleep(max(0.0, t1 + 5.0 - time.monotonic()))  # stall 3 is seen >= 1 s (the bound) past the interval
        err = stall()
        held = re.findall(r"nothing heard from the gateway .*\[1 stall not logged since the last one logged (\d+) s ago, "
                          r"([0-9.]+) s in all\]", err)  # fmt: skip
        assert len(held) == 1 and 4 <= int(held[0][0]) <= 15 and 0.5 <= float(held[0][1]) <= 2, err
        assert err.count("nothing heard") == 1 and err.count("the gateway answers again, ") == 1, err
    finally:
        conn.close()
        gw.resume()
        assert gw.stop() == 0


def test_the_gateways_memory_is_not_its_card_failing(workdir):
    """Review r9 H2: a store the gateway answers "out of memory for the store buffer" (an I/O error code; its
    address space capped with RLIMIT_AS, so it cannot map the buffer) fails with that message, but the gateway's
    card is not reported failing: /health stays 200, gateway_card_healthy 1."""
    gw = Gateway(workdir).start()
    conn, c, port = metrics_connector(gw, timeout_ms=4000)
    try:
        keys, datas = keys_and_datas(2)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        with open(f"/proc/{gw.proc.pid}/status") as f:
            vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
        resource.prlimit(gw.proc.pid, resource.RLIMIT_AS, (vm + (16 << 20), resource.RLIM_INFINITY))
        big = bytearray(payload("big", 96 << 20))
        ok, err, _ = c.set(["big"], [memoryview(big)])
        assert not ok and "out of memory" in err, err
        code, doc = health(port)
        assert (code, doc["gateway_card_healthy"]) == (200, True), doc
        assert conn.stats()["gateway_card_error"] == ""
    finally:
        if gw.proc and gw.proc.poll() is None:
            resource.prlimit(gw.proc.pid, resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        conn.close()
        assert gw.stop() == 0


class OneContextHeld:
    """A gateway with one I/O context (--io-contexts 1) on a tmpfs card (Unix socket and TCP), and connector A
    whose load through the ring holds that context for 3 s from start() (ADP_TEST_RING_PIECE_DELAY_MS: 0.3 s
    before each of the object's ten 1 MiB pieces; process_memory=False, so it takes the context for its whole
    batch): whatever else needs a context meanwhile waits for it, with the gateway working."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="adphc-", dir="/dev/shm")  # memory-speed: a ring load goes in pieces
        self.gw = Gateway(self.dir, tcp=True, extra=("--io-contexts", "1")).start(
            env={"ADP_TEST_RING_PIECE_DELAY_MS": 300}
        )
        self.a = RawConnector(
            ADPConnector(gateway=self.gw.unix_url, num_workers=1, timeout_ms=30000, process_memory=False)
        )
        self.key, size = "held@0", 10 << 20
        self.data = payload(self.key, size)
        assert self.a.set([self.key], [memoryview(self.data)])[0]  # only loads' pieces are delayed
        self.out = bytearray(size)

    def start(self) -> None:
        self.fid = self.a.conn.submit_batch_get([self.key], [memoryview(self.out)])
        time.sleep(0.3)  # A holds the context now (its first piece alone takes 0.3 s)

    def finish(self) -> None:
        ok, err, per_key = self.a.wait(self.fid, timeout=10)
        assert ok and per_key == [True] and bytes(self.out) == self.data, err

    def close(self) -> None:
        self.a.conn.close()
        if self.gw.proc:
            assert self.gw.stop() == 0
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_gateway_waiting_for_an_io_context(transport):
    """While A holds the gateway's only I/O context for 3 s (OneContextHeld), connector B's store waits that long
    for it with no reply. The gateway works (behind A's I/O), so B's /health stays 200: every 100 ms while B's
    request waits for the context (IoContextPool::acquire) it bumps B's alive word (unix: the ring's control page,
    r7) or sends B a kAlive frame (tcp, r8). Before, B read stalled 1 s into its wait (health3, item 1), over TCP
    until its reply came."""
    held = OneContextHeld()
    gw, port = held.gw, free_port()
    where = (
        {"gateway": gw.unix_url, "process_memory": False}  # through the ring, as A: a context for the batch
        if transport == "unix"
        else {"gateway": gw.tcp_url, "token_file": gw.token_file}
    )
    conn = ADPConnector(num_workers=1, timeout_ms=30000, metrics_port=port, gateway_stall_s=STALL_S, **where)
    b = RawConnector(conn)
    try:
        small = [payload(f"b@{i}", 1 << 20) for i in range(2)]
        assert b.set(["b@0"], [memoryview(small[0])])[0]  # B connected: its wait below is its request's alone
        held.start()
        r, took, seen = health_while(port, lambda: b.set(["b@1"], [memoryview(small[1])]))
        assert r[0], r
        # B waited for A's context past the bound: long enough to have read stalled.
        assert took >= 1.5 * STALL_S, (took, seen, gw.log())
        assert [s for s in seen if s[1] != 200] == [], seen
        held.finish()
        assert conn.stats()["gateway_stalled"] is False
    finally:
        conn.close()
        held.close()


@pytest.mark.parametrize("asked", [True, False])
def test_alive_frames_over_tcp_only_to_a_client_that_asks(asked):
    """r8 on the wire: a TCP client whose Hello sets FEATURE_ALIVE is granted it in HelloOk and, while its batch
    waits for the I/O context A holds (OneContextHeld), gets kAlive frames with its batch's request id (empty
    bodies, one per 100 ms slice of the wait in which the gateway moved: about one per A's 0.3 s piece, review r10
    R3), then its BatchReply; a client that does not ask (an r7 client) gets the
    BatchReply alone."""
    held = OneContextHeld()
    s = socket.create_connection(("127.0.0.1", held.gw.port))
    s.settimeout(10)

    def exact(n: int) -> bytes:
        got = b""
        while len(got) < n:
            more = s.recv(n - len(got))
            assert more, f"the gateway closed the connection:\n{held.gw.log()}"
            got += more
        return got

    def recv() -> tuple[int, int, bytes]:
        ftype, n, rid = wire.parse_header(exact(wire.HEADER.size))
        return ftype, rid, exact(n)

    try:
        s.sendall(wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode(), features=FEATURE_ALIVE if asked else 0)))
        ftype, _, body = recv()
        assert ftype == wire.HELLO_OK and bool(struct.unpack_from("<I", body)[0] & FEATURE_ALIVE) == asked, body
        held.start()
        data = payload("w@0", 4096)
        s.sendall(wire.frame(wire.BATCH, 2, wire.batch(wire.PUT, [b"w@0"], [len(data)], [0], data, 20000)))
        t0, frames = time.monotonic(), []
        while not frames or frames[-1][0] != wire.BATCH_REPLY:
            ftype, rid, body = recv()
            frames.append((ftype, rid, len(body), round(time.monotonic() - t0, 2)))
        took = time.monotonic() - t0
        assert took >= 1.5, frames  # it waited for the context
        alive = [f for f in frames if f[0] == FRAME_TYPES["ALIVE"]]
        assert [f[:3] for f in frames] == [(FRAME_TYPES["ALIVE"], 2, 0)] * len(alive) + [
            (wire.BATCH_REPLY, 2, frames[-1][2])
        ]
        if asked:
            assert len(alive) >= took / 0.3 / 2, frames  # about one per A's piece (half, on a busy host)
        else:
            assert alive == [], frames
        held.finish()
    finally:
        s.close()
        held.close()


def test_a_gateway_waiting_for_store_buffer_room_is_not_stalled(workdir):
    """The store buffers of all connections capped at 16 MiB (--max-store-buffer-total-mb): connector A's process
    store of ten 1 MiB objects holds 10 MiB of it for 3 s (ADP_TEST_SEGMENT_WRITE_DELAY_MS: 0.3 s before each
    object's read from A's memory), and connector B's 8 MiB store, sent meanwhile, waits that long for room with
    no reply. The gateway works, so B's /health stays 200: it bumps B's alive word every slice (20 ms) of the wait
    (ClientHandler::grow_store_buffer). Before, B read stalled 1 s into its wait (health3, item 1)."""
    gw = Gateway(workdir, extra=("--max-store-buffer-total-mb", "16", "--process-write-threads", "0"))
    gw.start(env={"ADP_TEST_SEGMENT_WRITE_DELAY_MS": 300})
    a = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=30000))
    conn, b, port = metrics_connector(gw, timeout_ms=30000, gateway_stall_s=STALL_S)
    try:
        assert b.set(["b@0"], [memoryview(payload("b@0", 4096))])[0]  # B connected (and holds 1 MiB of buffer)
        keys = [f"a@{i}" for i in range(10)]
        datas = [payload(k, 1 << 20) for k in keys]
        fid = a.conn.submit_batch_set(keys, [memoryview(d) for d in datas])

        # B's store goes once the gateway holds A's 10 MiB (B's 1 MiB beside them): A's first object's read is 0.3 s
        # after they are taken. It slept 0.3 s instead: A's batch reaching the gateway later than that (a loaded
        # host), B's 8 MiB took their room first and did not wait at all.
        def held() -> int:
            return read_gateway_stats(gw.unix_url)["store_buffer_bytes"]

        assert eventually(lambda: held() >= 11 << 20, 20), (held(), gw.log())
        big = payload("b@1", 8 << 20)
        r, took, seen = health_while(port, lambda: b.set(["b@1"], [memoryview(big)]))
        assert r[0], r
        assert took >= 1.5 * STALL_S, (took, seen, gw.log())  # waited for A's room past the bound
        assert [s for s in seen if s[1] != 200] == [], seen
        ok, err, per_key = a.wait(fid, timeout=10)
        assert ok and all(per_key), err
        st = conn.stats()
        assert st["process_stores"] == 2 and st["gateway_stalled"] is False, st  # from B's memory, not the ring
        out = bytearray(8 << 20)
        assert b.get(["b@1"], [memoryview(out)])[0] and bytes(out) == big
    finally:
        a.conn.close()
        conn.close()
        assert gw.stop() == 0


def connect_workers(conn: ADPConnector, gw: Gateway, clients: int, within: float = 10.0) -> list[float]:
    """Pairs of lookups on conn until gw counts `clients` connections (a worker connects on its first batch, the
    first one at the connector's start), each answered with a hit (a@0 and b@0 stored); fails after `within` s.
    Bounded by time, not by a count of pairs: under load one worker took all of 50 pairs (20 ms) while the other
    was not scheduled (hello29: twice beside 2 busy loops). Returns each pair's seconds from its submit to its
    last answer. The count must hold over 3 pairs in a row: under load a worker's start-up connect can end after its
    first batch connected on its own (RemoteSession::take_start's 100 ms), and that surplus connection is counted
    until the worker's next batch drops it, so one worker could read as two (session 40's fresh-clone run: `clients`
    3 where 2 were expected, right after such a stop)."""
    c = RawConnector(conn)
    took: list[float] = []
    deadline = time.monotonic() + within
    streak = 0
    while True:
        t = time.monotonic()
        fids = [conn.submit_batch_exists([k]) for k in ("a@0", "b@0")]
        answers = [c.wait(f, timeout=10) for f in fids]
        took.append(round(time.monotonic() - t, 3))
        assert all(a[0] and a[2] == [True] for a in answers), (answers, took, gw.log())
        streak = streak + 1 if read_gateway_stats(gw.unix_url)["clients"] == clients else 0
        if streak == 3:
            return took
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{clients} connections not counted in {within} s ({len(took)} pairs of lookups, the longest "
                f"{max(took)} s):\n" + gw.log()
            )


class WedgedLoads:
    """A gateway with one I/O context (--io-contexts 1) on a tmpfs card whose loads' card reads "hang" `hang_ms`
    (ADP_TEST_RING_PIECE_DELAY_MS before each 1 MiB object's one piece, inside the context), a@0 and b@0 stored,
    and connector C (two workers, each connected beforehand, through the ring, gateway_stall_s=STALL_S). start():
    C's load of a@0 takes the context and hangs in its read (wedge(): the gateway's DEBUG line for that read); then
    C's load of b@0 waits for the context, and nothing in the gateway moves."""

    # The gateway's DEBUG line as a ring piece's read begins to "hang" under its I/O context (the test hook's).
    HUNG = re.compile(r"client #\d+: a ring piece's read waits \d+ ms under its I/O context")

    def __init__(self, hang_ms: int):
        self.dir = tempfile.mkdtemp(prefix="adpwc-", dir="/dev/shm")
        self.gw = Gateway(self.dir, extra=("--io-contexts", "1")).start(
            env={"ADP_TEST_RING_PIECE_DELAY_MS": hang_ms, "ADP_LOG_LEVEL": "DEBUG"}
        )
        self.conn = None
        try:
            w = RawConnector(ADPConnector(gateway=self.gw.unix_url, num_workers=1, timeout_ms=20000))
            self.keys = ["a@0", "b@0"]
            self.datas = [payload(k, 1 << 20) for k in self.keys]
            ok = w.set(self.keys, [memoryview(x) for x in self.datas])[0]  # only loads' pieces are delayed
            w.conn.close()
            assert ok, self.gw.log()
            assert eventually(lambda: read_gateway_stats(self.gw.unix_url)["clients"] == 0, 10), self.gw.log()
            self.conn = ADPConnector(
                gateway=self.gw.unix_url, num_workers=2, timeout_ms=20000, process_memory=False, gateway_stall_s=STALL_S
            )
            # Both of C's workers connected before the wedge (51d7d78), so that b's load goes on a connection made
            # already: these tests are about the wait for the context. A connect during the wedge is
            # test_a_client_connecting_while_card_io_is_wedged_is_answered's.
            connect_workers(self.conn, self.gw, 2)
        except BaseException:
            self.close()
            raise
        self.c = RawConnector(self.conn)
        self.outs = [bytearray(1 << 20), bytearray(1 << 20)]

    def wedge(self) -> None:
        """C's load of a@0 sent; returns once the gateway logged its read hung under the one I/O context."""
        self.fa = self.conn.submit_batch_get(["a@0"], [memoryview(self.outs[0])])
        assert eventually(lambda: self.HUNG.search(self.gw.log()), 10), self.gw.log()

    def start(self) -> None:
        self.wedge()
        self.t0 = time.monotonic()
        self.fb = self.conn.submit_batch_get(["b@0"], [memoryview(self.outs[1])])

    def sample(self) -> tuple[float, bool]:
        """(seconds since b's load was sent, gateway_stalled)."""
        return round(time.monotonic() - self.t0, 2), self.conn.stats()["gateway_stalled"]

    def finish(self) -> None:
        """Both loads answer once the read ends, and C reads the gateway working again."""
        ra, rb = self.c.wait(self.fa, timeout=20), self.c.wait(self.fb, timeout=20)
        assert ra[0] and rb[0] and [bytes(o) for o in self.outs] == self.datas, (ra, rb, self.gw.log())
        assert self.conn.stats()["gateway_stalled"] is False

    def close(self) -> None:
        if self.conn:
            self.conn.close()
        assert self.gw.stop() == 0
        shutil.rmtree(self.dir, ignore_errors=True)


def test_a_gateway_wedged_in_card_io_is_stalled():
    """The gateway's only I/O context held by a load whose card read hangs 3 s (WedgedLoads): the connector's other
    worker's load waits for that context, and nothing in the gateway moves. The waiter bumps its alive word only
    when contexts moved since its last bump (a context given back, card work done under one by any connection), so
    the connector reads stalled within the bound (+ 0.5 s) of the wait, and working again once the read ends and
    both loads answer. Before (edeb1c2), the wait bumped every 100 ms and masked the hung read (review r10 R3).
    test_a_gateway_waiting_for_an_io_context is the busy pool beside it, which does not read stalled."""
    w = WedgedLoads(3000)
    try:
        w.start()
        seen = []
        while time.monotonic() - w.t0 < STALL_S + 0.5:
            seen.append(w.sample())
            time.sleep(0.05)
        seen.append(w.sample())
        assert seen[-1][1] is True, str(seen)
        w.finish()
    finally:
        w.close()


def test_a_gateway_wedged_in_card_io_is_stalled_while_others_store():
    """As test_a_gateway_wedged_in_card_io_is_stalled (WedgedLoads, the read hung 4 s here), while a second
    connector S stores 3 MiB objects from its process memory in a loop (4 workers, 1.5 s deadline): each store reads
    its client's memory, holding no context, then waits for the context and fails. Those reads free no context, so
    C's waiter does not count them as the gateway moving (card_progress: contexts given back, card work done under
    one): C reads stalled from the bound (+ 0.5 s) on, in every sample until the read ends; then both loads answer.
    Review r10 R3b: before, S's piece reads moved the one `progress` C's waiter looked at, and C read stalled only
    now and then (9 of 28 samples)."""
    w = WedgedLoads(4000)
    s = None
    stop = threading.Event()
    storers: list[threading.Thread] = []
    stored = [0]
    try:
        s = RawConnector(ADPConnector(gateway=w.gw.unix_url, num_workers=4, timeout_ms=1500))
        big = [bytearray(payload(f"s{j}", 3 << 20)) for j in range(4)]

        def store(j: int) -> None:
            n = 0
            while not stop.is_set():
                s.set([f"s{j}@{n}"], [memoryview(big[j])])
                stored[0] += 1
                n += 1

        w.start()
        storers = [threading.Thread(target=store, args=(j,)) for j in range(4)]
        for t in storers:
            t.start()
        seen = []
        while time.monotonic() - w.t0 < 3.2:  # the read hangs until 3.7 s at the earliest
            seen.append(w.sample())
            time.sleep(0.05)
        stop.set()
        for t in storers:
            t.join()
        late = [x for x in seen if x[0] >= STALL_S + 0.5]
        assert len(late) >= 10 and all(x[1] for x in late), (stored[0], seen)
        assert stored[0] >= 4, stored  # S stored (and failed) meanwhile: its reads went on
        w.finish()
    finally:
        stop.set()
        for t in storers:
            t.join()
        if s:
            s.conn.close()
        w.close()


def test_a_client_connecting_while_card_io_is_wedged_is_answered():
    """The gateway's only I/O context held by a load whose card read hangs 10 s (WedgedLoads.wedge(), synchronized
    on the gateway's line for that read): a status query is answered, and a NEW connector N (defaults: the ring and
    process memory; two workers) connects both its workers during the wedge: one by the start-up connect, the other
    on its first batch (the path of a new worker of a connector already connected). N's store of n@0 holds one
    worker (it waits for the wedged context until its 4 s deadline), so N's lookups go to the other. A connect's
    handshake (Hello, HelloOk, process registration) takes no I/O context and no card I/O, so N's lookups (the
    index only) are answered inside the connector's 2 s connect bound (connect_timeout_ms), no outage, while the read
    still hangs (batch_gets 0 after them). Brief hello29: session 28 saw a worker that connected during such a wedge
    get its HelloOk past 2 s once under load (51d7d78); not reproduced here. Red with a handshake that takes the I/O
    context: N's connect times out, "unavailable: gateway did not answer in time"."""
    w = WedgedLoads(10000)
    n = None
    try:
        w.wedge()
        t0 = time.monotonic()
        st = read_gateway_stats(w.gw.unix_url, timeout=5)  # a status query: its own handshake, then Stats
        query_s = round(time.monotonic() - t0, 3)
        assert st["clients"] == 2 and st["batch_gets"] == 0, st
        t1 = time.monotonic()
        n = ADPConnector(gateway=w.gw.unix_url, num_workers=2, timeout_ms=4000)
        made_s = round(time.monotonic() - t1, 3)
        rn = RawConnector(n)
        data = payload("n@0", 1 << 20)
        fput = n.submit_batch_set(["n@0"], [memoryview(data)])  # its worker waits for the context
        took = connect_workers(n, w.gw, 4)  # C's two and N's two
        first_s = round(time.monotonic() - t1, 3)
        nst = n.stats()
        # Still wedged: a's load not answered (the one get), so every connect above was made during the wedge.
        assert read_gateway_stats(w.gw.unix_url)["batch_gets"] == 0, (query_s, first_s, took, w.gw.log())
        # Inside the bound: a connect past it fails its lookup as an outage (asserted in connect_workers).
        assert nst["gateway_reachable"] is True and nst["gateway_error"] == "", nst
        print(
            f"status query {query_s} s, N made in {made_s} s, {len(took)} pairs of its lookups, the longest "
            f"{max(took)} s (the last answered {first_s} s after its start)"
        )
        put = rn.wait(fput, timeout=20)
        assert not put[0] and n.stats()["gateway_reachable"] is True, put  # timed out waiting: no outage
        ra = w.c.wait(w.fa, timeout=20)
        assert ra[0] and bytes(w.outs[0]) == w.datas[0], (ra, w.gw.log())
    finally:
        if n:
            n.close()
        w.close()


def test_a_card_failing_and_working_interleaved_reads_failing_throughout(workdir, monkeypatch, capfd):
    """A card with a bad range (truncated to 2 MiB: some objects fail, the rest hit): 40 loads alternating a good
    and a bad object. The gateway's card (healthy) and the connector's gateway_card_healthy read failing from the
    first error throughout, logged once each (not a WARNING and an INFO per load: review r10 R2); a hit 2 s
    (ADP_TEST_CARD_FAILING_HOLD_MS, kFailingHold 10 s otherwise) after the last error ends the episode, logged
    once with its error count."""
    hold = {"ADP_TEST_CARD_FAILING_HOLD_MS": 2000}
    gw = Gateway(workdir).start(env=hold)
    monkeypatch.setenv("ADP_TEST_CARD_FAILING_HOLD_MS", "2000")
    conn = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=4000)
    c = RawConnector(conn)
    size = 0
    try:
        keys = [f"f@{i}" for i in range(16)]
        datas = [payload(k, 256 << 10) for k in keys]
        assert c.set(keys, [memoryview(x) for x in datas])[0]
        size = os.path.getsize(gw.card)
        os.truncate(gw.card, 2 << 20)
        good, bad = [], []
        for k, x in zip(keys, datas, strict=True):
            ok, err, _ = c.get([k], [memoryview(bytearray(len(x)))])
            (good if ok else bad).append(k)
        assert (
            good
            and bad
            and all(("unexpected end of card" in c.get([k], [memoryview(bytearray(256 << 10))])[1]) for k in bad[:1])
        )
        healthy = []
        for _ in range(20):
            for k in (good[0], bad[0]):
                c.get([k], [memoryview(bytearray(256 << 10))])
                healthy.append((conn.stats()["gateway_card_healthy"], read_gateway_stats(gw.unix_url)["healthy"]))
        assert set(healthy) == {(False, False)}, healthy
        err = capfd.readouterr().err
        log = gw.log()
        assert err.count("the gateway's card fails I/O") == 1 and "works again" not in err, err
        assert log.count("I/O failing") == 1 and "works again" not in log, log
        time.sleep(2.2)  # no error for the hold
        assert c.get([good[0]], [memoryview(bytearray(256 << 10))])[0]
        st = conn.stats()
        assert st["gateway_card_healthy"] is True and st["gateway_card_error"] == "", st
        assert read_gateway_stats(gw.unix_url)["healthy"] is True
        err, log = capfd.readouterr().err, gw.log()
        ends = re.findall(r"the gateway's card works again \((\d+) I/O errors in", err)
        assert len(ends) == 1 and int(ends[0]) >= 21, err  # every bad load counted
        gends = re.findall(r"I/O works again \((\d+) I/O errors in", log)
        assert len(gends) == 1 and int(gends[0]) >= 21, log
    finally:
        if size:
            os.truncate(gw.card, size)
        conn.close()
        assert gw.stop() == 0


ALIVE_AT = 72  # the alive word in the ring's control page (r7, frame.h kAliveAt)


def alive_word(c) -> int:
    return struct.unpack_from("<I", c.map, ALIVE_AT)[0]


def reply_statuses(c, batch: bytes) -> list[int]:
    """Sends a Batch on c's connection; the status of each item of its reply."""
    c.send(wire.BATCH, batch)
    ftype, body = c.recv()
    assert ftype == wire.BATCH_REPLY, (ftype, body)
    return [body[8 + 16 * i] for i in range(struct.unpack_from("<I", body)[0])]


def test_the_alive_word_moves_per_put_chunk_and_per_exists_and_delete_item():
    """On the wire (a hand-driven ring with a control page): a put of 40 1 MiB objects from the ring goes to the card
    in three chunks (16 MiB each at most, kPutChunkBytes) and the alive word moves once per chunk, after its
    store.put (review r10 T1: nothing else bumps during a ring or segment store, so this is the only sign of life
    of a store the card takes long); an exists and a delete of 5 keys move it once per item (review r10 N3: one
    delete batch that takes the card long does not read stalled)."""
    d = tempfile.mkdtemp(prefix="adpaw-", dir="/dev/shm")
    gw = Gateway(d).start()
    c = None
    try:
        c = RingClient(gw, ring_bytes=48 * MIB)
        assert c.features & FEATURE_RING_PROGRESS  # a control page
        keys = [f"chunk@{i}".encode() for i in range(40)]
        data = b"".join(payload(k.decode(), MIB) for k in keys)
        c.map[CONTROL : CONTROL + len(data)] = data
        offsets = [CONTROL + i * MIB for i in range(len(keys))]
        moved = {}
        for what, batch, n in (
            ("put", wire.batch(wire.PUT, keys, [MIB] * len(keys), offsets), len(keys)),
            ("exists", wire.batch(wire.EXISTS, keys[:5]), 5),
            ("delete", wire.batch(wire.DELETE, keys[:5]), 5),
        ):
            a0 = alive_word(c)
            assert reply_statuses(c, batch) == [0] * n, what
            moved[what] = alive_word(c) - a0
        assert moved == {"put": 3, "exists": 5, "delete": 5}  # the put: 16 + 16 + 8 objects
    finally:
        if c:
            c.close()
        assert gw.stop() == 0
        shutil.rmtree(d, ignore_errors=True)


def test_the_alive_word_moves_per_process_load_piece():
    """Review r10 N3: a process load's pieces bump the alive word (ClientHandler::load_into_process's sink), so one
    object whose pieces go out slowly does not read stalled: a 3 MiB + 100 object written into this process by the
    connection's thread alone (--process-write-threads 0) in 256 KiB pieces moves it once per piece and once for
    the item."""
    d = tempfile.mkdtemp(prefix="adpap-", dir="/dev/shm")
    gw = Gateway(d, extra=("--process-write-threads", "0")).start()
    c = None
    try:
        pm_store(gw, ["piece@0"])
        c = ProcessClient(gw)
        c.register()
        buf = ctypes.create_string_buffer(PM_SIZE)
        a0 = alive_word(c)
        assert c.get([b"piece@0"], [PM_SIZE], [ctypes.addressof(buf)]) == [(0, b"")]
        assert buf.raw == payload("piece@0", PM_SIZE)
        assert alive_word(c) - a0 == -(-PM_SIZE // PM_PIECE) + 1
    finally:
        if c:
            c.close()
        assert gw.stop() == 0
        shutil.rmtree(d, ignore_errors=True)


def test_a_gateway_hung_between_published_pieces_is_logged_stalled(workdir, capfd):
    """Review r10 T2: a ring load in pieces (a tmpfs card, process_memory=False, 0.2 s before each 1 MiB piece) whose
    gateway is stopped (SIGSTOP) after its first pieces were published: the load waits in
    RemoteSession::call_in_pieces for the next piece, and the stall's WARNING comes from that loop's own check
    within the bound plus its check interval, with no scrape, while the load still waits; SIGCONT: the load
    completes and the INFO that the gateway answers again is logged."""
    d = tempfile.mkdtemp(prefix="adphp-", dir="/dev/shm")
    gw = Gateway(d).start(env={"ADP_TEST_RING_PIECE_DELAY_MS": 200})
    conn = ADPConnector(
        gateway=gw.unix_url, num_workers=1, timeout_ms=20000, process_memory=False, gateway_stall_s=STALL_S
    )
    c = RawConnector(conn)
    try:
        key, size = "pieces@0", 8 * MIB
        data = payload(key, size)
        assert c.set([key], [memoryview(data)])[0]
        capfd.readouterr()
        out = bytearray(size)
        fid = conn.submit_batch_get([key], [memoryview(out)])
        time.sleep(0.5)  # two pieces published, the third on its way
        gw.pause()
        ok, err, per_key = stall_logged_until_resumed(gw, conn, c, fid, capfd, time.monotonic())
        assert ok and per_key == [True] and bytes(out) == data, (err, per_key)
        assert read_gateway_stats(gw.unix_url)["ring_piece_loads"] == 1  # it went in pieces
    finally:
        conn.close()
        gw.resume()
        assert gw.stop() == 0
        shutil.rmtree(d, ignore_errors=True)


class RefusingGateway:
    """Answers every Hello with the Error frame a TCP gateway sends for a wrong token, or with answer(request id);
    counts the Hellos."""

    def __init__(self, answer=None):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.hellos = 0
        self.hello_times: list[float] = []  # time.monotonic() of each Hello
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        reason = b"authentication failed: wrong or missing token"
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    ftype, rid, _ = wire.recv_frame(conn)
                    if ftype == wire.HELLO:
                        self.hellos += 1
                        self.hello_times.append(time.monotonic())
                    refusal = wire.frame(wire.ERROR, rid, struct.pack("<H", len(reason)) + reason)
                    conn.sendall(self.answer(rid) if self.answer else refusal)
                except (ConnectionError, OSError):
                    pass


def wrong_token_connector(workdir, capfd) -> tuple[Gateway, str, ADPConnector, int]:
    """A TCP gateway and a one-worker connector on it whose token_file holds a wrong token, with a metrics port
    (stderr read up to its start): the gateway, that token file, the connector and its port."""
    gw = Gateway(workdir, tcp=True).start()
    bad = f"{workdir}/bad-token"
    with open(bad, "w") as f:
        f.write("not-the-token")
    port = free_port()
    capfd.readouterr()
    conn = ADPConnector(gateway=gw.tcp_url, token_file=bad, num_workers=1, timeout_ms=3000, metrics_port=port)
    return gw, bad, conn, port


def test_a_refused_token_is_one_error_saying_what_to_fix(workdir, capfd):
    """A TCP gateway refusing the token was logged "its requests fail until it is back (reconnecting with
    back-off)" and retried from 50 ms up: a wrong token never heals by itself (audit 12 note 22). Now one ERROR
    naming token_file and a restart, the longest back-off (2 s) at once, gateway_token_refused and a /health
    reason that says so; a good token clears it."""
    gw, bad, conn, port = wrong_token_connector(workdir, capfd)
    c = RawConnector(conn)
    try:
        for _ in range(5):
            ok, err, _ = c.set(["k"], [memoryview(b"v")])
            assert not ok and "authentication failed" in err, err
        st = conn.stats()
        assert (st["gateway_token_refused"], st["gateway_reachable"]) == (True, False), st
        code, doc = health(port)
        assert code == 503 and doc["gateway_token_refused"] is True, doc
        assert len(doc["reasons"]) == 1 and "refused this connector's token" in doc["reasons"][0], doc
        assert "fix it and restart" in doc["reasons"][0], doc
        assert scrape(port)["lmcache_adp_gateway_token_refused"] == 1
        rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in format_status(st).splitlines())
        assert rows["gateway reachable"].startswith("NO: the gateway refused this connector's token"), rows
        err = capfd.readouterr().err
        said = [line for line in err.splitlines() if "refused this connector's token" in line]
        assert len(said) == 1 and "ERROR" in said[0] and "token_file" in said[0] and "restart" in said[0], err
        assert "requests reconnect, with back-off" not in err, err
    finally:
        conn.close()
    conn = ADPConnector(gateway=gw.tcp_url, token_file=gw.token_file, num_workers=1, timeout_ms=3000)
    try:
        assert RawConnector(conn).set(["k"], [memoryview(b"v")])[0]
        assert conn.stats()["gateway_token_refused"] is False
    finally:
        conn.close()
        assert gw.stop() == 0
    # Back-off: the longest at once. Requests for 1.5 s (every 50 ms) ask the gateway once; from 50 ms up
    # doubling they asked it 5 times.
    fake = RefusingGateway()
    conn = ADPConnector(gateway=f"tcp://127.0.0.1:{fake.port}", token_file=bad, num_workers=1, timeout_ms=3000)
    try:
        c = RawConnector(conn)
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end:
            assert not c.exists(["k"])[0]
            time.sleep(0.05)
        assert fake.hellos == 1, fake.hellos
    finally:
        conn.close()
        fake.listener.close()


# How long the start-up connect's verdict may take to show in /health: a missing socket fails at once and a
# refused token within a round trip, but worker 0's start, the gateway's accept and the metrics thread's answer
# each wait for a CPU on a loaded machine (CI: load 12-15 on 2 cores). No batch is sent in these tests, so the
# bound does not decide what they show (without the start-up connect /health stays 200 however long).
BEFORE_TRAFFIC_S = 5


def test_health_says_unreachable_before_the_first_batch(workdir, capfd):
    """Audit 13 item 6: connections were made at the first batch, so a connector whose `gateway` names a socket
    that does not exist (a typo) answered /health 200 {"healthy": true, "gateway_reachable": true} until traffic
    failed. Its first worker now connects at start, in the background: 503 and gateway_reachable false with no
    batch sent (at once here; BEFORE_TRAFFIC_S at most), and the one WARNING."""
    port = free_port()
    capfd.readouterr()
    conn = ADPConnector(gateway=f"unix://{workdir}/none.sock", num_workers=1, timeout_ms=2000, metrics_port=port)
    try:
        doc = wait_health(port, 503, within=BEFORE_TRAFFIC_S)
        assert (doc["healthy"], doc["gateway_reachable"]) == (False, False), doc
        assert any("none.sock" in r and "unreachable" in r for r in doc["reasons"]), doc
        assert scrape(port)["lmcache_adp_gateway_reachable"] == 0
        st = conn.stats()
        assert st["gateway_reachable"] is False and st["stores"] == st["hits"] == st["misses"] == 0, st
        err = capfd.readouterr().err
        said = [line for line in err.splitlines() if "requests reconnect, with back-off" in line]
        assert len(said) == 1 and "WARNING" in said[0] and "none.sock" in said[0], err
    finally:
        conn.close()


RING_FIX = "a retry cannot heal this: fix ring_mb (or the gateway's --max-ring-mb) and restart"
RING_REFUSED = "a ring of 2048 MiB is larger than this gateway allows per connection (1024 MiB, --max-ring-mb)"


def test_a_gateway_that_refuses_the_connector_says_why_until_it_allows_it(workdir, capfd):
    """A running gateway refusing the connector's ring (ring_mb above its --max-ring-mb) read on /health as
    "unreachable", and its WARNING said "until it is back" (audit 15 items 18): the operator found the gateway up
    and no reason, and no retry heals it. The refusal is now the stat gateway_error, named in /health's reason and
    `status --url`, and the one WARNING ends in what to fix; a gateway restarted with a larger limit clears it."""
    port = free_port()
    gw = Gateway(workdir).start()  # the default --max-ring-mb, 1024
    capfd.readouterr()
    conn = ADPConnector(gateway=gw.url, ring_mb=2048, num_workers=1, timeout_ms=2000, metrics_port=port)
    c = RawConnector(conn)
    try:
        doc = wait_health(port, 503, within=BEFORE_TRAFFIC_S)  # the start-up connect's refusal: no batch needed
        assert doc["reasons"] == [
            f"gateway {gw.unix_url} answers but refuses this connector: {RING_REFUSED}; {RING_FIX}; loads miss and "
            "stores are dropped until a connect succeeds"
        ], doc
        for _ in range(4):  # the batches' own connects are refused too: no second WARNING
            ok, err, _ = c.set(["k"], [memoryview(b"v")])
            assert not ok and "--max-ring-mb" in err, err
            time.sleep(0.2)
        st = conn.stats()
        assert st["gateway_error"] == f"gateway refused: {RING_REFUSED}; {RING_FIX}", st
        rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in format_status(st).splitlines())
        assert rows["gateway reachable"].startswith(
            "NO (loads miss, stores are dropped; /health answers 503): the gateway answers but refuses this "
            f"connector: {RING_REFUSED}; {RING_FIX}; "
        ), rows  # `lmcache-adp status --url`
        said = [line for line in capfd.readouterr().err.splitlines() if " WARNING: " in line and gw.url in line]
        assert len(said) == 1 and RING_REFUSED in said[0] and said[0].endswith(RING_FIX), said
        assert "until it is back" not in said[0], said

        gw.stop()
        gw.extra = ["--max-ring-mb", "2048"]
        gw.start()
        doc = wait_health(port, 200, within=10)  # the background reconnect: every 2 s at the longest
        assert "reasons" not in doc and conn.stats()["gateway_error"] == "", (doc, conn.stats()["gateway_error"])
        assert c.set(["k"], [memoryview(b"v")])[0]
    finally:
        conn.close()
        if gw.proc:
            gw.stop()


def test_a_gateway_of_another_protocol_version_says_what_to_fix(workdir, capfd):
    """A gateway whose frames carry another protocol version is refused by the connector at the handshake: no
    retry heals it either, so the WARNING and gateway_error end in what to fix, not "until it is back"."""
    fake = RefusingGateway(answer=lambda rid: wire.frame(wire.HELLO_OK, rid, b"", version=wire.VERSION + 1))
    token_file = os.path.join(workdir, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    capfd.readouterr()
    port = free_port()
    conn = ADPConnector(gateway=f"tcp://127.0.0.1:{fake.port}", token_file=token_file, num_workers=1,
                        timeout_ms=2000, metrics_port=port)  # fmt: skip
    try:
        doc = wait_health(port, 503, within=BEFORE_TRAFFIC_S)
        fix = "a retry cannot heal this: run the connector and the gateway of one lmcache-adp release (this one speaks"
        want = f"protocol version {wire.VERSION + 1} (this side speaks {wire.VERSION}); {fix} protocol version "
        assert conn.stats()["gateway_error"] == f"{want}{wire.VERSION}) and restart", conn.stats()["gateway_error"]
        (reason,) = doc["reasons"]
        assert reason.startswith(f"gateway tcp://127.0.0.1:{fake.port} unreachable: {want}"), reason
        said = [line for line in capfd.readouterr().err.splitlines() if " WARNING: " in line and str(fake.port) in line]
        assert len(said) == 1 and said[0].endswith(f"{fix} protocol version {wire.VERSION}) and restart"), said
    finally:
        conn.close()
        fake.listener.close()


def test_the_start_does_not_wait_on_the_gateway(workdir):
    """Audit 13 item 6's connect at start runs on a thread of its own: the connector's constructor does not wait on
    the gateway. (The test above said so with `time.monotonic() - t0 < 1`, which could not fail: a missing socket
    fails at once, waited on or not; review r14.) Here a gateway reads the Hello and answers nothing. A start that
    waited on it would return only once its connect gave up (connect_timeout_ms, 2 s) and had closed the connection;
    this one returns while the connection is open with its Hello unanswered, so the connection ends (that give-up,
    or the close below) after the constructor returned."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)
    token_file = os.path.join(workdir, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    constructed = threading.Event()
    seen: dict[str, bool] = {}

    def silent_gateway():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(60)
            seen["hello"] = wire.recv_frame(conn)[0] == wire.HELLO
            while conn.recv(4096):  # until the connector ends the connection
                pass
            seen["constructed before the connection ended"] = constructed.is_set()

    t = threading.Thread(target=silent_gateway, daemon=True)
    t.start()
    conn = ADPConnector(
        gateway=f"tcp://127.0.0.1:{listener.getsockname()[1]}", token_file=token_file, num_workers=1, timeout_ms=2000
    )
    constructed.set()
    try:
        t.join(30)  # its connect gives up after connect_timeout_ms: the connection ends
    finally:
        conn.close()
        listener.close()
    t.join(30)
    assert seen == {"hello": True, "constructed before the connection ended": True}, seen


def test_a_refused_token_shows_before_the_first_batch(workdir, capfd):
    """Audit 13 item 6, over TCP: a wrong token gave its ERROR and gateway_token_refused only when a batch
    failed. The connect at start asks the gateway at once."""
    gw, _, conn, port = wrong_token_connector(workdir, capfd)
    try:
        doc = wait_health(port, 503, within=BEFORE_TRAFFIC_S)
        assert (doc["gateway_token_refused"], doc["gateway_reachable"]) == (True, False), doc
        assert scrape(port)["lmcache_adp_gateway_token_refused"] == 1
        err = capfd.readouterr().err
        said = [line for line in err.splitlines() if "refused this connector's token" in line]
        assert len(said) == 1 and "ERROR" in said[0], err
    finally:
        conn.close()
        assert gw.stop() == 0


def test_a_gateway_started_after_its_connector_is_reachable_once_up(workdir):
    """The connect at start fails (503 at once); the gateway then starts: the next batch connects and /health is
    200 again, with no reconnect counted (the session's first connection)."""
    gw = Gateway(workdir)
    port = free_port()
    conn = ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=2000, metrics_port=port)
    c = RawConnector(conn)
    try:
        doc = wait_health(port, 503, within=BEFORE_TRAFFIC_S)
        assert doc["gateway_reachable"] is False, doc
        gw.start()
        keys, datas = keys_and_datas(3)
        store_until_ok(c, keys, datas, gw, "no store once the gateway started")
        code, doc = health(port)
        assert (code, doc["healthy"], doc["gateway_reachable"]) == (200, True, True), doc
        assert conn.stats()["gateway_reconnects"] == 0
    finally:
        conn.close()
        if gw.proc:
            assert gw.stop() == 0


# kMaxBackoff (src_cpp/transport/remote_backend.cc): the longest wait between a connector's connects to a gateway
# that is down, and the wait after a refused token.
MAX_BACKOFF_S = 2.0
# What a connect and the scrape after it may take beyond that on a loaded machine (CI: load 12-15 on 2 cores).
SLACK_S = 3.0


def adp_threads() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass
    return [n for n in names if n.startswith("adp-")]


@contextlib.contextmanager
def one_store_on_a_gateway(workdir, extra: tuple[str, ...] = ()):
    """A gateway (`extra`: its flags), a one-worker connector on it with a metrics port, and two keys stored
    through it. Yields (the gateway, the connector, its RawConnector, the port, the keys, their bytes); closes the
    connector and stops the gateway after."""
    gw = Gateway(workdir, extra=extra).start()
    conn, c, port = metrics_connector(gw, timeout_ms=2000)
    try:
        keys, datas = keys_and_datas(2)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        yield gw, conn, c, port, keys, datas
    finally:
        conn.close()
        if gw.proc:
            assert gw.stop() == 0


class ClosingListener:
    """A Unix socket listener at `path` (a gateway's, the gateway away) that closes every connection at once: a
    connector's handshake fails there as on a gateway that went away. `times`: when each came (time.monotonic())."""

    def __init__(self, path: str):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        self.times: list[float] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.times.append(time.monotonic())
            conn.close()

    def longest_gap(self) -> float:
        times = list(self.times)
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(2)
        self.listener.close()
        self.thread.join(10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# ADP_TEST_MAX_BACKOFF_MS for a test that reaches the longest back-off: doubling from 50 ms, 800 ms is the fifth
# wait (after 50, 100, 200, 400 ms), its tries 400 ms apart before it; 2 s (kMaxBackoff) would be the seventh.
SHORT_MAX_BACKOFF_S = 0.8


def test_an_idle_connector_reconnects_in_the_background(workdir, capfd, monkeypatch):
    """Review r14 S2: after its gateway went away and came back, a connector with no traffic stayed unreachable
    (503, gateway_reachable 0) until LMCache's next batch, and a readiness probe on /health waited for traffic that
    waited for it. A background reconnect now tries at the back-off's pace: /health 200 within the longest back-off
    (plus slack) of the restart with no batch sent, INFO "connected" again. The next batch takes that connection (it
    does not fail on its session's back-off, nor open a second one: the gateway counts one client) and it is
    counted once as a reconnect. The gateway comes back once the background tries are the longest back-off apart
    (seen by a listener in the gateway's place that closes each: the case is that one, whatever the machine's
    speed; a sleep of 2.5 s here left it in a shorter one, or not, as the gateway's start took), that longest made
    0.8 s (ADP_TEST_MAX_BACKOFF_MS) so as to be reached in 1.5 s, not 3.2 s."""
    monkeypatch.setenv("ADP_TEST_MAX_BACKOFF_MS", str(int(SHORT_MAX_BACKOFF_S * 1000)))
    with one_store_on_a_gateway(workdir) as (gw, conn, c, port, keys, datas):
        gw.kill()
        away = ClosingListener(gw.socket)
        try:
            assert not c.set(keys, [memoryview(d) for d in datas])[0], "a store succeeded with the gateway killed"
            wait_health(port, 503, within=BEFORE_TRAFFIC_S)
            # Two tries at least half the longest back-off apart: the wait before the next is the longest.
            longest = eventually(lambda: away.longest_gap() >= 0.75 * SHORT_MAX_BACKOFF_S, 10 * SHORT_MAX_BACKOFF_S)
            assert longest, f"the background tries never came the longest back-off apart: {away.times}"
        finally:
            away.close()
        capfd.readouterr()
        gw.start()
        doc = wait_health(port, 200, within=SHORT_MAX_BACKOFF_S + SLACK_S)
        assert (doc["healthy"], doc["gateway_reachable"]) == (True, True), doc
        assert scrape(port)["lmcache_adp_gateway_reachable"] == 1
        err = capfd.readouterr().err
        assert len([line for line in err.splitlines() if " INFO: " in line and ": connected (" in line]) == 1, err
        assert conn.stats()["gateway_reconnects"] == 0  # no session has taken it yet
        ok, why, _ = c.set(keys, [memoryview(d) for d in datas])
        assert ok, why
        assert load_all_ok(c, keys, datas)
        assert conn.stats()["gateway_reconnects"] == 1
        assert (
            read_gateway_stats(gw.unix_url)["clients"] == 1
        )  # the session's, the background one's (a status query: not counted)
        assert "WARNING" not in capfd.readouterr().err


def load_all_ok(c: RawConnector, keys: list[str], datas: list[bytes]) -> bool:
    bufs = [bytearray(len(d)) for d in datas]
    ok, why, _ = c.get(keys, [memoryview(b) for b in bufs])
    assert ok, why
    return [bytes(b) for b in bufs] == datas


# futex(2)'s number (/proc/PID/task/TID/syscall's first field), and FUTEX_WAIT_BITSET, the operation (less
# FUTEX_PRIVATE_FLAG and FUTEX_CLOCK_REALTIME) of glibc's timed condition variable wait.
FUTEX = {"x86_64": 202, "aarch64": 98}
FUTEX_WAIT_BITSET = 9


def in_timed_wait(thread: str) -> bool:
    """Whether this process's thread named `thread` is blocked in a timed wait on a condition variable (futex(2),
    FUTEX_WAIT_BITSET with a timeout): not running, not blocked on a mutex (FUTEX_WAIT, no timeout), not in a
    connect's poll(2)."""
    futex = FUTEX[os.uname().machine]
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != thread:
                    continue
            with open(f"/proc/self/task/{tid}/syscall") as f:
                call = f.read().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if len(call) > 4 and call[0] == str(futex):
            op, timeout = int(call[2], 16), int(call[4], 16)
            return op & 0x7F == FUTEX_WAIT_BITSET and timeout != 0
    return False


def test_close_during_the_background_back_off_returns_promptly(workdir):
    """The background reconnect waits out its back-off (here the longest, 2 s: a refused token) on a condition
    that close() signals: close() returns in well under that wait (half of it: a generous bound, not a speed
    claim), and the reconnect thread is joined (no adp- thread left). close() comes once the thread is in that
    wait (blocked in a timed futex wait, /proc/self/task/TID/syscall: the one timed wait of its loop while the
    gateway is away), not 0.2 s after the thread was seen, which assumed it had got there."""
    fake = RefusingGateway()
    bad = f"{workdir}/bad-token"
    with open(bad, "w") as f:
        f.write("not-the-token")
    try:
        conn = ADPConnector(gateway=f"tcp://127.0.0.1:{fake.port}", token_file=bad, num_workers=1, timeout_ms=3000)
        try:
            # In the 2 s wait that follows the start-up connect's refusal.
            assert eventually(lambda: in_timed_wait("adp-reconnect"), BEFORE_TRAFFIC_S), adp_threads()
            assert fake.hellos == 1 and conn.stats()["gateway_token_refused"], (fake.hellos, conn.stats())
        finally:
            t0 = time.monotonic()
            conn.close()
            took = time.monotonic() - t0
        assert took < MAX_BACKOFF_S / 2, f"close() took {took:.2f} s: it waited out the back-off"
        assert adp_threads() == [], adp_threads()
    finally:
        fake.listener.close()


def test_a_refused_token_is_not_retried_faster_than_the_longest_back_off(workdir, capfd):
    """An idle connector whose token the gateway refuses: the background reconnect asks again (it did not ask at
    all), every kMaxBackoff at the soonest (a refused token does not heal by itself: no 50 ms first back-off), and
    the ERROR stays one line."""
    fake = RefusingGateway()
    bad = f"{workdir}/bad-token"
    with open(bad, "w") as f:
        f.write("not-the-token")
    capfd.readouterr()
    try:
        conn = ADPConnector(gateway=f"tcp://127.0.0.1:{fake.port}", token_file=bad, num_workers=1, timeout_ms=3000)
        try:
            assert eventually(lambda: len(fake.hello_times) >= 3, 3 * MAX_BACKOFF_S + 2 * SLACK_S), fake.hello_times
            time.sleep(0.5)
        finally:
            conn.close()
        gaps = [b - a for a, b in zip(fake.hello_times, fake.hello_times[1:], strict=False)]
        assert min(gaps) >= MAX_BACKOFF_S - 0.05, gaps
        err = capfd.readouterr().err
        said = [line for line in err.splitlines() if "refused this connector's token" in line]
        assert len(said) == 1 and "ERROR" in said[0], err
    finally:
        fake.listener.close()


def test_an_idle_connector_sees_its_gateway_stop_and_come_back(workdir, capfd):
    """Audit 15 item 22: a connector connected and idle when its gateway stopped read reachable (/health 200,
    gateway_reachable 1) until its next batch found the connection closed. The reconnect thread looks at the
    connections every kIdleLook: all of them idle and closed by the gateway, a status query tells a gateway gone
    from one closing idle connections; here it fails: 503 and the outage WARNING within kMaxBackoff (plus slack),
    no batch sent. Restarted, the gateway is reachable again with no batch, and the next batch succeeds."""
    with one_store_on_a_gateway(workdir) as (gw, conn, c, port, keys, datas):
        capfd.readouterr()
        assert gw.stop() == 0
        doc = wait_health(port, 503, within=MAX_BACKOFF_S + SLACK_S)
        assert doc["gateway_reachable"] is False, doc
        err = capfd.readouterr().err
        said = [line for line in err.splitlines() if "until it is back" in line]
        assert len(said) == 1 and "closed this connector's connections" in said[0], err
        gw.start()
        wait_health(port, 200, within=MAX_BACKOFF_S + SLACK_S)
        ok, why, _ = c.set(keys, [memoryview(d) for d in datas])
        assert ok, why
        assert conn.stats()["gateway_reconnects"] == 1


def test_a_gateway_closing_idle_connections_is_not_an_outage(workdir, capfd):
    """The other side: a gateway with --idle-timeout-s 1 closes the idle connector's connection while it runs. The
    status query that tells the two apart is answered: no WARNING, /health 200 throughout, and the next batch
    connects anew (no failed batch)."""
    with one_store_on_a_gateway(workdir, ("--idle-timeout-s", "1")) as (gw, conn, c, port, keys, datas):
        capfd.readouterr()
        end = time.monotonic() + 2 * MAX_BACKOFF_S + 1.5
        while time.monotonic() < end:
            code, doc = health(port)
            assert code == 200, doc
            time.sleep(0.1)
        assert "idle for 1 s" in gw.log()
        assert "WARNING" not in capfd.readouterr().err
        ok, why, _ = c.set(keys, [memoryview(d) for d in datas])
        assert ok, why


# kIdleLook (src_cpp/transport/remote_backend.cc): how often the reconnect thread looks at an idle connector's
# connections, and asks a status query while none is open.
IDLE_LOOK_S = 1.0


def connected_lines(log: str) -> list[str]:
    """The gateway's INFO lines of a connection made (a client's; a status query's are DEBUG)."""
    return [line for line in log.splitlines() if " INFO" in line and re.search(r"client #\d+ connected \(", line)]


def test_an_idle_closed_connector_holds_nothing_on_the_gateway(workdir, capfd):
    """Review r15 N13: a connector whose connections the gateway closed for idleness (--idle-timeout-s) connected
    again at once to tell an idle close from a stop, and kept that connection: one --max-clients slot and one ring
    held for good, "connected" and "idle ... closing" INFO lines in the gateway's log every timeout. It now asks a
    status query (no slot, no ring, DEBUG lines) every kIdleLook instead: after ~5 s idle at a 1 s timeout, the
    gateway counts no client and no ring bytes and logged one "connected" per worker at most; /health 200
    throughout, no WARNING. Stopped under it, the gateway is seen gone with no batch (503); restarted, it is
    reachable again with no batch, and the next batch works."""
    gw = Gateway(workdir, extra=("--idle-timeout-s", "1")).start()
    port = free_port()
    conn = ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=2000, metrics_port=port)
    c = RawConnector(conn)
    try:
        keys, datas = keys_and_datas(4)
        for i in range(4):  # a few batches, so both workers may have connected
            assert c.set(keys[i : i + 1], [memoryview(datas[i])])[0]
        capfd.readouterr()
        end = time.monotonic() + 5
        while time.monotonic() < end:
            code, doc = health(port)
            assert code == 200, doc
            time.sleep(0.1)
        for _ in range(8):  # across two looks at least: a connection held for part of each look's cycle is seen
            st = read_gateway_stats(gw.unix_url)
            assert (st["clients"], st["ring_bytes"]) == (0, 0), (st, gw.log())
            time.sleep(0.25)
        log = gw.log()
        assert 1 <= len(connected_lines(log)) <= 2, log  # one per worker at most, none since the idle closes
        assert "idle for 1 s" in log
        assert "WARNING" not in capfd.readouterr().err

        assert gw.stop() == 0
        doc = wait_health(port, 503, within=IDLE_LOOK_S + SLACK_S)
        assert doc["gateway_reachable"] is False, doc
        gw.start()
        wait_health(port, 200, within=MAX_BACKOFF_S + SLACK_S)
        ok, why, _ = c.set(keys, [memoryview(d) for d in datas])
        assert ok, why
        assert load_all_ok(c, keys, datas)
    finally:
        conn.close()
        if gw.proc:
            assert gw.stop() == 0
