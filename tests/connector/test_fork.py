# SPDX-License-Identifier: Apache-2.0
"""A connector or card store used in a process forked from the one that opened it (debt39 item 1, review38)."""

from __future__ import annotations

import json
import os
import select

import pytest

from lmcache_adp import ADPConnector, CardStore
from tests.helpers import RawConnector
from tests.support.gateway import temp_gateway

SIZE = 64 << 10


def in_child(body, log_path: str, timeout_s: float = 120.0) -> dict:
    """Runs body() in a child of os.fork(), its stderr (the native log) in log_path; returns the dict it returns,
    read back through a pipe. The child leaves by os._exit: nothing of the parent's closed or flushed there."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        code = 1
        try:
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            out = body()
            os.write(w, json.dumps(out).encode())
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent, whatever it is
            os.write(w, json.dumps({"raised": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([r], [], [], timeout_s)
            assert ready, f"the forked child reported nothing in {timeout_s} s"
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    out = json.loads(data or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0 and "raised" not in out, out
    return out


def error_lines(log_path: str) -> list[str]:
    with open(log_path, errors="replace") as f:
        return [line for line in f.read().splitlines() if " ERROR: " in line]


@pytest.mark.parametrize("where", ["embedded", "gateway"])
def test_an_inherited_connector_refuses_every_operation_in_a_forked_child(where, card, tmp_path):
    """review38: a forked child storing on an inherited embedded connector shared the card with its parent's
    in-memory view (index, frontier): both writing overwrite each other's records. Before debt39 the child's lookup
    answered from the parent's index (a hit), and its puts and gets waited for workers that are not in the child
    (its futures failed at their deadline), on a gateway over the parent's connections. Now in the child every put
    and delete fails at once, every get and lookup misses, nothing reaches the card or the gateway, and one ERROR
    line names the parent's pid and says to open a new connector there; the parent is unaffected."""
    ctx = temp_gateway() if where == "gateway" else None
    gw = ctx.__enter__() if ctx else None
    params = dict(gateway=gw.unix_url) if gw else dict(card=card, card_size_gb=0.0625)
    conn = ADPConnector(**params, num_workers=2, timeout_ms=20000)
    c = RawConnector(conn)
    try:
        assert c.set(["parent@1"], [memoryview(b"\x11" * SIZE)])[0]
        parent = os.getpid()

        def child() -> dict:
            put = c.set(["child@1"], [memoryview(b"\x22" * SIZE)])
            out = bytearray(SIZE)
            got = c.get(["parent@1"], [memoryview(out)])
            looked = c.exists(["parent@1", "child@1"])
            deleted = c.delete(["parent@1"])
            stats = conn.stats()  # answered, nothing of the parent's backend asked
            conn.close()  # the child's: the parent's threads and card or connections left alone
            return dict(
                put=put, get=got, untouched=bytes(out) == bytes(SIZE), exists=looked, delete=deleted, stats=len(stats)
            )

        log = str(tmp_path / "child.log")
        got = in_child(child, log)
        assert got["put"][0] is False and got["put"][2] == [False], got
        assert f"forked from pid {parent}" in got["put"][1], got
        assert got["get"][2] == [False] and got["untouched"], got
        assert got["exists"][2] == [False, False], got
        assert got["delete"][0] is False, got
        said = error_lines(log)
        assert len(said) == 1, said
        assert f"forked from pid {parent}" in said[0] and "open a new ADPConnector in this process" in said[0], said
        # The parent's connector works on, and nothing of the child's is stored.
        assert c.set(["parent@2"], [memoryview(b"\x33" * SIZE)])[0]
        assert c.exists(["parent@1", "parent@2", "child@1"])[2] == [True, True, False]
        out = bytearray(SIZE)
        assert c.get(["parent@1"], [memoryview(out)])[2] == [True] and bytes(out) == b"\x11" * SIZE
    finally:
        conn.close()
    # Reopened (the embedded card recovered from what is on it; the gateway's card as it holds it): the parent's
    # objects, none of the child's.
    again = RawConnector(ADPConnector(**params, num_workers=1, timeout_ms=20000))
    try:
        assert again.exists(["parent@1", "parent@2", "child@1"])[2] == [True, True, False]
    finally:
        again.conn.close()
        if ctx:
            ctx.__exit__(None, None, None)


def test_an_inherited_card_store_writes_nothing_in_a_forked_child(card, tmp_path):
    """The same for a CardStore (tools' direct access): in a forked child put and remove raise, get and exists
    miss, close writes nothing, one ERROR line; the parent's store goes on, and the card has nothing of the child's.
    Before debt39 the child's put was written to the card, into the parent's frontier."""
    s = CardStore(card, create_bytes=64 << 20)
    try:
        s.put("parent@1", b"\x11" * SIZE)
        parent = os.getpid()

        def child() -> dict:
            out = {}
            for name, call in (
                ("put", lambda: s.put("child@1", b"\x22" * SIZE)),
                ("remove", lambda: s.remove("parent@1")),
            ):
                try:
                    out[name] = repr(call())
                except RuntimeError as e:
                    out[name] = "raised: " + str(e)
            out["get"] = s.get("parent@1") is None
            out["exists"] = s.exists("parent@1")
            s.close()
            return out

        log = str(tmp_path / "child.log")
        got = in_child(child, log)
        assert got["put"].startswith("raised: ") and f"forked from pid {parent}" in got["put"], got
        assert got["remove"].startswith("raised: "), got
        assert got["get"] is True and got["exists"] is False, got
        said = error_lines(log)
        assert len(said) == 1 and f"forked from pid {parent}" in said[0], said
        s.put("parent@2", b"\x33" * SIZE)
        assert s.get("parent@1") == b"\x11" * SIZE and not s.exists("child@1")
    finally:
        s.close()
    s = CardStore(card)
    try:
        assert s.exists("parent@1") and s.exists("parent@2") and not s.exists("child@1")
        assert s.get("parent@2") == b"\x33" * SIZE
    finally:
        s.close()


def test_a_grandchild_of_an_inherited_connector_has_its_own_eventfd(card, tmp_path):
    """review39: the child's first call gives it an eventfd of its own on the inherited number, but that was done
    once per connector, not per process: a child forked from that child (a worker's own worker) took the child's
    eventfd as it was, so its drain() took the child's signal (a completion of the child's then woke nobody: the
    child's wait on its eventfd lost it) and its own completions woke the child's drainer, and it said no ERROR
    line of its own. Now each forked process makes its own on its first call, and says its line."""
    conn = ADPConnector(card=card, card_size_gb=0.0625, num_workers=2, timeout_ms=20000)
    c = RawConnector(conn)
    try:
        assert c.set(["parent@1"], [memoryview(b"\x11" * SIZE)])[0]

        def child() -> dict:
            fid = conn.submit_batch_exists(["parent@1"])  # its first call (the child's own eventfd), not drained yet
            fd = conn.event_fd()

            def grandchild() -> dict:
                ok, _, per_key = c.exists(["parent@1"])  # waits on its eventfd and drains it
                return dict(ok=ok, per_key=per_key)

            grand_log = str(tmp_path / "grandchild.log")
            grand = in_child(grandchild, grand_log)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            woke = bool(poller.poll(0))  # the child's completion is still signalled: the grandchild drained its own
            drained = [d[0] for d in conn.drain_completions()]
            return dict(grand=grand, grand_said=error_lines(grand_log), woke=woke, fid=fid, drained=drained)

        got = in_child(child, str(tmp_path / "child.log"))
        assert got["grand"] == dict(ok=True, per_key=[False]), got
        assert got["woke"] and got["drained"] == [got["fid"]], got
        assert len(got["grand_said"]) == 1 and "open a new ADPConnector in this process" in got["grand_said"][0], got
        assert c.exists(["parent@1"])[2] == [True]
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["connector", "store"])
@pytest.mark.parametrize("where", ["disk", "memory"])
def test_a_forked_child_does_not_keep_the_card_locked(kind, where, card, shm_dir, tmp_path):
    """fork40 item 1: a forked child kept its copy of the card's descriptor (and a memory card's mapping of it), so
    the card's flock (its open file description's) stayed held while the child lived: the parent that closed its
    embedded connector or CardStore could not open the card again ("already open by another connector or gateway").
    Now a child keeps nothing of the card: with one child that only waits and one that closed the inherited
    connector or store, both alive, the parent closes its own and opens the card again, and finds its object."""
    path = os.path.join(shm_dir, "card.img") if where == "memory" else card

    def open_card():
        if kind == "connector":
            return ADPConnector(card=path, card_size_gb=0.0625, num_workers=1, timeout_ms=20000)
        return CardStore(path, create_bytes=64 << 20)

    def put(obj, key: str) -> None:
        if kind == "connector":
            assert RawConnector(obj).set([key], [memoryview(b"\x11" * SIZE)])[0]
        else:
            obj.put(key, b"\x11" * SIZE)

    def has(obj, key: str) -> bool:
        if kind == "connector":
            return RawConnector(obj).exists([key])[2] == [True]
        return obj.exists(key)

    first = open_card()
    put(first, "parent@1")
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    children = []
    try:
        for closes in (False, True):
            pid = os.fork()
            if pid == 0:  # the child: (closes the inherited one,) says so, then lives until the parent closes w
                code = 1
                try:
                    os.close(w)
                    fd = os.open(str(tmp_path / f"child-{int(closes)}.log"), os.O_WRONLY | os.O_CREAT, 0o600)
                    os.dup2(fd, 2)
                    if closes:
                        first.close()
                    os.write(ready_w, b"1")
                    os.read(r, 1)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        # Both children running (past fork()'s handlers in the child, which let go of the card: until the child is
        # scheduled to run them, its copies of the descriptor and the mapping are still there).
        ready = b""
        while len(ready) < 2:
            chunk = os.read(ready_r, 2)
            assert chunk, "a child ended before it said it was ready"
            ready += chunk
        first.close()
        again = open_card()  # main: "card ... is already open by another connector or gateway"
        try:
            assert has(again, "parent@1")
            put(again, "parent@2")
        finally:
            again.close()
    finally:
        for fd in (r, ready_r, ready_w):
            os.close(fd)
        os.close(w)  # the children's read returns: they leave
        for pid in children:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0


def test_futures_pending_at_the_fork_complete_in_the_child(card, tmp_path, monkeypatch):
    """fork40 item 4: a future the parent submitted and had not drained at the fork never completed in the child (its
    drain() handed over only the child's own futures, and the parent's workers are not there): a child waiting on it
    waited for ever. Now the child's drain() hands over each: one done at the fork as it was done (a lookup that
    found its key), one still in flight (a load whose delivery is paused) completed as the child's own would be (a
    miss), with the child's one ERROR line; the parent's own wait gets its real results."""
    monkeypatch.setenv("ADP_TEST_DELIVERY_DELAY_MS", "3000")  # read by the connector at construction
    conn = ADPConnector(card=card, card_size_gb=0.0625, num_workers=2, timeout_ms=20000)
    c = RawConnector(conn)
    try:
        assert c.set(["parent@1"], [memoryview(b"\x11" * SIZE)])[0]
        done = conn.submit_batch_exists(["parent@1"])
        poller = select.poll()
        poller.register(conn.event_fd(), select.POLLIN)
        assert poller.poll(20000), "the lookup did not complete"  # completed, not drained
        out = bytearray(SIZE)
        pending = conn.submit_batch_get(["parent@1"], [memoryview(out)])  # its delivery paused 3 s: in flight

        def child() -> dict:
            cc = RawConnector(conn)
            got = cc.wait(pending, timeout=20.0)  # main: TimeoutError (no thread here completes it)
            was = cc.wait(done, timeout=20.0)
            return dict(got=list(got), was=list(was))

        log = str(tmp_path / "child.log")
        got = in_child(child, log)
        assert got["got"] == [True, "", [False]], got
        assert got["was"] == [True, "", [True]], got
        said = error_lines(log)
        assert len(said) == 1 and "open a new ADPConnector in this process" in said[0], said
        assert c.wait(done)[2] == [True]
        assert c.wait(pending)[2] == [True] and bytes(out) == b"\x11" * SIZE
    finally:
        conn.close()


def test_a_grandchild_of_an_inherited_card_store_says_its_error_line(card, tmp_path):
    """fork40 item 5: a CardStore's ERROR line was said once per store, a flag copied into a child of the child that
    said it: that grandchild refused its work without a line of its own. Now each forked process says it once."""
    s = CardStore(card, create_bytes=64 << 20)
    try:
        s.put("parent@1", b"\x11" * SIZE)
        opener = os.getpid()

        def child() -> dict:
            found = s.exists("parent@1")  # the child's line

            def grandchild() -> dict:
                return dict(exists=s.exists("parent@1"))

            grand_log = str(tmp_path / "grandchild.log")
            grand = in_child(grandchild, grand_log)
            return dict(found=found, grand=grand, grand_said=error_lines(grand_log))

        log = str(tmp_path / "child.log")
        got = in_child(child, log)
        assert got["found"] is False and got["grand"] == dict(exists=False), got
        assert len(error_lines(log)) == 1, error_lines(log)
        said = got["grand_said"]
        assert len(said) == 1 and f"forked from pid {opener}" in said[0], got  # main: [] (the child's flag copied)
        assert s.exists("parent@1")
    finally:
        s.close()
