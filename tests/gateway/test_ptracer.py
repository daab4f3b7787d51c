# SPDX-License-Identifier: Apache-2.0
"""Yama ptrace_scope 1 (docs/protocol.md, "Process memory"): the connector names
its gateway with PR_SET_PTRACER, one gateway per process. By default a
restarted gateway gets the ring (following it would trust whoever binds the
socket path); with ptracer_follow=True the record follows it and process memory
is used again after the restart. With two gateways, the one named keeps the
record while it runs; a connection to the other keeps the ring, and (with
ptracer_follow) registers once the first gateway has exited. A forked child
names its gateway afresh and never closes a descriptor it inherited.

On a kernel with Yama at scope 1 the test runs as it is. Without Yama (or at
scope 0, where any gateway of the uid may already write the client) it sets up
what it needs: ADP_TEST_YAMA_PTRACE_SCOPE=1 makes the connector act as at scope
1, and tests/support/prctl_record_shim.cc (LD_PRELOAD) stands in for the
kernel's record, writing down each pid named. Scopes 2 and 3 refuse every
gateway: the test fails and says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "tests" / "support" / "prctl_record_shim.cc"
YAMA = "/proc/sys/kernel/yama/ptrace_scope"

# Runs the whole story in one client process (LD_PRELOAD must be there from
# its start), starting its gateways itself, and prints what it saw as JSON.
CHILD = """
import json, os, sys, time
os.environ.pop("LD_PRELOAD", None)  # the gateways this child starts load no shim
from lmcache_adp import ADPConnector, _native
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.helpers import RawConnector, payload
from tests.support.gateway import Gateway

SIZE = 1 << 20
out = {}

def use(c, keys):
    # Stores and loads keys (until they land: the connector reconnects with back-off after a restart).
    deadline = time.monotonic() + 20
    while True:
        ok = c.set(keys, [memoryview(bytearray(payload(k, SIZE))) for k in keys])[0]
        bufs = [bytearray(SIZE) for _ in keys]
        got, _, hits = c.get(keys, [memoryview(b) for b in bufs])
        if ok and got and all(hits) and all(bytes(b) == payload(k, SIZE) for b, k in zip(bufs, keys)):
            st = c.conn.stats()
            return {"process_stores": st["process_stores"], "process_loads": st["process_loads"]}
        assert time.monotonic() < deadline, "keys did not land"
        time.sleep(0.1)

def forked_child(url):
    # A child forked without exec whose inherited pidfd number now holds a file of its own (as after
    # os.closerange and an open): its registration must leave that file open.
    pidfds = []
    for f in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{f}") == "anon_inode:[pidfd]":
                pidfds.append(int(f))
        except OSError:
            pass  # the listing's own descriptor
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            res = {"pidfds": len(pidfds)}
            f = os.open(os.path.join(sys.argv[1], "child-file"), os.O_RDWR | os.O_CREAT, 0o600)
            os.dup2(f, pidfds[0])
            os.close(f)
            ino = os.fstat(pidfds[0]).st_ino
            cc = RawConnector(ADPConnector(gateway=url, num_workers=1, timeout_ms=5000))
            res["use"] = use(cc, ["c@0"])
            cc.conn.close()
            try:
                res["file_kept"] = os.fstat(pidfds[0]).st_ino == ino
            except OSError as e:
                res["file_kept"] = repr(e)
            os.write(w, json.dumps(res).encode())
        except BaseException as e:
            os.write(w, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)

follow = sys.argv[3] == "follow"
if follow:
    # No connector of this story looks at its connections while idle (kIdleLook, 1 s): a gateway stopped or restarted
    # under an idle one is met by its next batch, as the story means, however long the restart takes. With the look,
    # a restart longer than 1 s (a loaded host) was seen by it: its outage logged, and a batch after it ran on the look's
    # new connection, not on the one the restart closed.
    os.environ["ADP_TEST_IDLE_LOOK_MS"] = "600000"  # read at each connector's start
a, b = Gateway(sys.argv[1]), Gateway(sys.argv[2])
try:
    if not follow:
        # A gateway in this very process needs no ptracer: it is not named, so the next gateway is.
        own = _native.GatewayServer(
            card=os.path.join(sys.argv[2], "own.img"),
            card_size_bytes=256 << 20,
            socket_path=os.path.join(sys.argv[2], "own.sock"),
        )
        co = RawConnector(ADPConnector(gateway="unix://" + os.path.join(sys.argv[2], "own.sock"), num_workers=1))
        out["own"] = use(co, ["o@0"])
        co.conn.close()
        own.close()
    a.start()
    ca = RawConnector(ADPConnector(gateway=a.url, num_workers=1, timeout_ms=5000, ptracer_follow=follow))
    out["a1"] = a.proc.pid
    out["before"] = use(ca, ["a@0", "a@1"])
    a.kill()
    a.start()  # the same card and socket, a new pid
    out["a2"] = a.proc.pid
    out["after"] = use(ca, ["a@2", "a@3"])
    out["a_stats"] = {k: read_gateway_stats(a.url)[k] for k in ("process_stores", "process_loads")}
    if not follow:
        ca.conn.close()  # no connector threads across the fork
        out["child"] = forked_child(a.url)
    else:
        b.start()  # a second gateway while the one named runs
        cb = RawConnector(ADPConnector(gateway=b.url, num_workers=1, timeout_ms=5000, ptracer_follow=True))
        out["b_pid"] = b.proc.pid
        out["b_while_a_runs"] = use(cb, ["b@0"])
        a.stop()
        out["b_same_connection"] = use(cb, ["b@1"])  # registers now that the named gateway has exited
        cb2 = RawConnector(ADPConnector(gateway=b.url, num_workers=1, timeout_ms=5000, ptracer_follow=True))
        out["b_new_connection"] = use(cb2, ["b@2"])
        # A re-registration that meets a connection its gateway closed while it was idle, within kIdleCheck of its
        # last frame (ADP_TEST_IDLE_CHECK_MS stands in for that window): made again at once on a new connection,
        # quietly, as a request is (it logged an outage and sent that batch through the ring).
        a.start()
        os.environ["ADP_TEST_IDLE_CHECK_MS"] = "600000"  # read at the connector's start
        cx = RawConnector(ADPConnector(gateway=a.url, num_workers=1, timeout_ms=5000, ptracer_follow=True))
        del os.environ["ADP_TEST_IDLE_CHECK_MS"]
        out["x_while_b_runs"] = use(cx, ["x@0"])  # refused while b runs: the ring, a retry pending
        b.stop()  # the named gateway exits: cx's next batch registers again...
        a.kill()
        a.start()  # ...on the connection this restart closed
        out["a4"] = a.proc.pid
        out["x_after_restart"] = use(cx, ["x@1"])
        for c in (ca, cb, cb2, cx):
            c.conn.close()
finally:  # no gateway left behind, also when a step above failed
    for g in (a, b):
        if g.proc:
            g.kill()
print(json.dumps(out), flush=True)
"""


def yama_scope():
    """Yama's ptrace_scope here (None: no Yama in this kernel; this VM: Linux 6.18, none); fails the test at 2 or 3."""
    try:
        scope = int(Path(YAMA).read_text())
    except FileNotFoundError:
        scope = None
    if scope is not None and scope >= 2:
        pytest.fail(f"Yama ptrace_scope is {scope} here: no gateway may write a client, so this test cannot run")
    return scope


def build_shim(tmp_path):
    """tests/support/prctl_record_shim.cc built into tmp_path: its path."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} not found: this test builds an LD_PRELOAD shim (set CXX)"
    shim = tmp_path / "prctl_record_shim.so"
    cmd = [cxx, "-std=c++20", "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", str(SHIM), "-o", str(shim)]
    r = subprocess.run([*cmd, "-ldl"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return shim


def run_story(tmp_path, mode):
    """Runs CHILD in `mode` ("follow" or "default"): its JSON, its stderr, the pids the shim saw named (None
    under real Yama)."""
    scope = yama_scope()
    env = {**os.environ, "ADP_LOG_LEVEL": "INFO"}
    log = tmp_path / "named"
    if scope != 1:  # stand in for Yama's record
        env.update(LD_PRELOAD=str(build_shim(tmp_path)), PRCTL_SHIM_LOG=str(log), ADP_TEST_YAMA_PTRACE_SCOPE="1")
    dirs = [tempfile.mkdtemp(prefix="adppt-", dir="/tmp") for _ in range(2)]  # short: socket paths
    try:
        r = subprocess.run(
            [sys.executable, "-c", CHILD, *dirs, mode], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
        )
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-5000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr, (log.read_text().split() if scope != 1 else None)


def test_a_restarted_gateway_gets_the_ring_without_ptracer_follow(tmp_path):
    out, err, named = run_story(tmp_path, "default")
    a1, a2 = out["a1"], out["a2"]
    assert out["own"] == {"process_stores": 1, "process_loads": 1}, out  # a gateway in the client's process
    assert out["before"] == {"process_stores": 2, "process_loads": 2}, out  # the first one named
    # After the restart: the ring (the counts stay), nothing through the new gateway's process memory.
    assert out["after"] == {"process_stores": 2, "process_loads": 2}, out
    assert out["a_stats"] == {"process_stores": 0, "process_loads": 0}, out
    want = f"named gateway pid {a1} has exited: reconnecting to a new gateway needs ptracer_follow=true"
    assert want in err, err[-5000:]
    # A forked child names its gateway afresh, and the file now under its inherited pidfd's number stays open.
    child = out["child"]
    assert child.get("pidfds") == 1 and child.get("file_kept") is True, child
    assert child["use"] == {"process_stores": 1, "process_loads": 1}, child
    if named is not None:
        assert named == [str(a1), str(a2)]  # the parent named a1 only (not itself); the child a2


def test_the_ptracer_record_follows_a_restarted_gateway_with_ptracer_follow(tmp_path):
    out, err, named = run_story(tmp_path, "follow")
    a1, a2, b = out["a1"], out["a2"], out["b_pid"]
    # Before the restart both went through process memory; after it, again (the ring would leave them as they were).
    assert out["before"] == {"process_stores": 2, "process_loads": 2}, out
    assert out["after"] == {"process_stores": 4, "process_loads": 4}, out
    assert out["a_stats"] == {"process_stores": 2, "process_loads": 2}, out  # the restarted gateway's own count
    assert f"names gateway pid {a2} with PR_SET_PTRACER (gateway pid {a1}, named before, has exited" in err
    # A second gateway while the first runs: the ring, and the refusal says why.
    assert out["b_while_a_runs"] == {"process_stores": 0, "process_loads": 0}, out
    assert f"this process names gateway pid {a2} with PR_SET_PTRACER, which still runs" in err, err[-5000:]
    # Once the first has exited, the refused connection registers on its next batch, and new ones too.
    assert out["b_same_connection"] == {"process_stores": 1, "process_loads": 1}, out
    assert out["b_new_connection"] == {"process_stores": 1, "process_loads": 1}, out
    assert f"names gateway pid {b} with PR_SET_PTRACER (gateway pid {a2}, named before, has exited" in err
    # The re-registration that met a closed connection: made on a new one within the batch, so both of its
    # operations went through process memory, and no outage was logged.
    assert out["x_while_b_runs"] == {"process_stores": 0, "process_loads": 0}, out
    assert out["x_after_restart"] == {"process_stores": 1, "process_loads": 1}, out
    assert "its requests fail until it is back" not in err, err[-5000:]
    if named is not None:
        assert named[:3] == [str(a1), str(a2), str(b)] and named[-1] == str(out["a4"]), named


# A fork while a connection's registration holds the ptracer record's lock and logs its WARNING under it (review40b):
# fork40's util/log.cc prepare handler took the line's lock before the record's handler (registered earlier as the
# library was loaded: prepare handlers run in the reverse order) took the record's, so the forking thread held the
# line's lock and waited for the record's, while the registering thread held the record's and waited for the line's:
# both for ever. The shim holds the registration inside prctl (the record's lock held) until the fork is under way.
FORK_CHILD = """
import os, sys, threading, time
os.environ.pop("LD_PRELOAD", None)  # the gateway this child starts loads no shim
from lmcache_adp import ADPConnector
from tests.helpers import RawConnector, payload
from tests.support.gateway import Gateway

SIZE = 1 << 20
hold, pids = sys.argv[2], sys.argv[3]
os.environ["ADP_TEST_IDLE_LOOK_MS"] = "600000"  # the restart met by the next batch (as the story above)
a = Gateway(sys.argv[1])


def started():
    a.start()
    with open(pids, "a") as f:
        f.write(f"{a.proc.pid}\\n")


def store(c, key):
    deadline = time.monotonic() + 60
    while not c.set([key], [memoryview(bytearray(payload(key, SIZE)))])[0]:
        assert time.monotonic() < deadline, "the key did not land"
        time.sleep(0.1)


try:
    started()
    ca = RawConnector(ADPConnector(gateway=a.url, num_workers=1, timeout_ms=20000, ptracer_follow=True))
    store(ca, "a@0")  # names the first gateway
    a.kill()
    started()  # a new pid: the next registration names it, with a WARNING under the record's lock
    open(hold, "w").close()
    t = threading.Thread(target=store, args=(ca, "a@1"))
    t.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(hold + ".held"):
        assert time.monotonic() < deadline, "no registration came"
        time.sleep(0.01)
    pid = os.fork()  # the worker inside prctl, the record's lock held: it logs its WARNING next
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    t.join()
    ca.conn.close()
finally:
    a.kill()
print("forked", flush=True)
"""


def test_a_fork_while_a_registration_logs_under_the_ptracer_lock_does_not_hang(tmp_path):
    yama_scope()
    shim = build_shim(tmp_path)
    hold, pids = tmp_path / "hold", tmp_path / "gateway-pids"
    # The shim stands in for Yama's record (also under a real scope 1: the hold is the shim's).
    env = {
        **os.environ,
        "ADP_LOG_LEVEL": "INFO",
        "LD_PRELOAD": str(shim),
        "PRCTL_SHIM_LOG": str(tmp_path / "named"),
        "ADP_TEST_YAMA_PTRACE_SCOPE": "1",
        "PRCTL_SHIM_HOLD": str(hold),
        "PRCTL_SHIM_HOLD_MS": "2000",
    }
    d = tempfile.mkdtemp(prefix="adppt-", dir="/tmp")  # short: socket paths
    try:
        r = subprocess.run(
            [sys.executable, "-c", FORK_CHILD, d, str(hold), str(pids)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired as e:
        for p in pids.read_text().split() if pids.exists() else []:  # its gateways: process groups of their own
            try:
                os.killpg(int(p), 9)
            except OSError:
                pass
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"the client hung at its fork (the log's and the ptracer record's locks): {err[-3000:]}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-5000:]
    assert r.stdout.strip().splitlines()[-1] == "forked", r.stdout
    assert "with PR_SET_PTRACER (gateway pid" in r.stderr, r.stderr[-5000:]  # the WARNING, logged under the lock
