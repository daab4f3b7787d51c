# SPDX-License-Identifier: Apache-2.0
"""adapter_params reply_spin_us (RemoteSession::spin_for_reply): a worker that sent a store or load sleeps, the
socket watched, until shortly before the round trip its earlier requests of the same op and size took, then polls
the socket without sleeping, so that the reply finds it awake; only while the load rule of the gateway's
--request-spin-us allows (util/idle_cpus.h: connections x 2 <= CPUs, runnable threads x 2 <= CPUs). No protocol
change: the gateway cannot tell. A worker stops spinning for an op whose spins rarely catch their reply (fewer than
4 of its last 16), but for 1 wait in 16 (a probe), and resumes once a probe catches it; only waits that polled are
counted (gateway_*_reply_spins). The client-side test hooks: ADP_TEST_CLIENT_CPUS (the CPUs the rule counts),
ADP_TEST_CPU_MAX_FILE (a cgroup v2 cpu.max whose quota caps the CPUs counted), ADP_TEST_LOADAVG_FILE (the runnable
threads it reads), ADP_TEST_STALL_CHECK_MS (a reply expected later than a
stall check is not spun for)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time

import pytest

from lmcache_adp import ADPConnector
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway.test_segments import ShmPool, stats
from tests.helpers import RawConnector, payload
from tests.support.gateway import Gateway

SIZE = 256 << 10


@contextlib.contextmanager
def slow_gateway_and_worker(
    monkeypatch, tmp_path, delay_ms: int, runnable: int, cpus: int | None, gateway_env: dict | None = None, **params
):
    """A gateway on a tmpfs card that sleeps delay_ms before each object it copies into or out of a segment (a
        round trip of about that long, steady against the wake-ups of a loaded host), a one-object /dev/shm pool, and
        a one-worker connector on it started with the client-side test hooks: `runnable` threads read from
        ADP_TEST_LOADAVG_FILE, `cpus` counted (ADP_TEST_CLIENT_CPUS; None: not set, and a `cpu_max` param is written to
    the file ADP_TEST_CPU_MAX_FILE names), the stall checked every 5 s
        (ADP_TEST_STALL_CHECK_MS: replies up to that far are spun for). `gateway_env`: the gateway's test hooks
        instead of ADP_TEST_SEGMENT_WRITE_DELAY_MS=delay_ms. Yields (gateway, pool, connector)."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"0.00 0.00 0.00 {runnable}/1234 5678\n")
    d = tempfile.mkdtemp(prefix="adpreplyspin-", dir="/dev/shm")
    gw = Gateway(d).start(env=gateway_env if gateway_env is not None else {"ADP_TEST_SEGMENT_WRITE_DELAY_MS": delay_ms})
    pool = ShmPool(1, SIZE)
    hooks = {"ADP_TEST_LOADAVG_FILE": loadavg, "ADP_TEST_STALL_CHECK_MS": 5000}
    if cpus is not None:
        hooks["ADP_TEST_CLIENT_CPUS"] = cpus
    if "cpu_max" in params:
        (tmp_path / "cpu.max").write_text(params.pop("cpu_max") + "\n")
        hooks["ADP_TEST_CPU_MAX_FILE"] = tmp_path / "cpu.max"
    for k, v in hooks.items():  # read at the connector's start only
        monkeypatch.setenv(k, str(v))
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000, **params))
    for k in hooks:
        monkeypatch.delenv(k)
    try:
        yield gw, pool, c
    finally:
        c.conn.close()
        pool.close()
        if gw.proc:
            gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def counted(c: RawConnector) -> dict:
    """The connector's stats once its one worker has counted every batch it ran: the spins are added after a
    batch's future completed (Connector::worker_loop: task_done, then the counts), so a read right after the
    completion (or 0.2 s after, on a loaded machine) could miss the last batch's (review r14b S2). The worker
    takes one more batch, a lookup (neither spun for nor counted), only once it has counted the one before, so
    that lookup's completion is the point where every earlier count is in."""
    c.exists(["counted@fence"])  # its result does not matter: a gateway gone fails it, after the count too
    return c.conn.stats()


def spin_counts(c: RawConnector) -> dict[str, tuple[int, int]]:
    """The connector's (gateway_{op}_reply_spins, gateway_{op}_reply_spin_hits) per op, once its worker counted them."""
    st = counted(c)
    return {op: (st[f"gateway_{op}_reply_spins"], st[f"gateway_{op}_reply_spin_hits"]) for op in ("put", "get")}


def slow_after_fast(c: RawConnector, pool: ShmPool, rounds: int, name: str) -> tuple[dict, list[dict]]:
    """`rounds` rounds of a store, then a load, of one SIZE object through the ring (plain memory, process memory
    off: no segment, no delay at the gateway, a round trip of ~0.1-1 ms), each followed by the same op of the same
    size from or into pool's segment (the gateway's delay before the object, ~100 ms). The fast op drops the
    worker's expectation to its own round trip (a sooner reply sets it), so the slow op's wait, where it spins,
    polls from at once for at most 10 ms and ends ~90 ms before its reply: one spin, no hit, whatever the host's
    load (its worker would have to be kept off a CPU for ~100 ms to miss the spin's start). The first fast op of
    each kind has nothing to expect: no spin. Each load's bytes are checked. Returns the counts after the first
    fast store and load, and the counts each slow op added ({op: (spins, hits)}: the fast ops' own waits, spun
    for when one takes longer than the ~12 ms it is then expected at, are left out)."""
    plain = memoryview(bytearray(SIZE))
    first, added = {}, []
    for r in range(rounds):
        key = f"{name}@{r}"
        for op in ("put", "get"):
            if op == "put":
                plain[:] = payload(key, SIZE)
                assert c.set([key + "/fast"], [plain])[0]
            else:
                plain[:] = b"\0" * SIZE
                assert c.get([key + "/fast"], [plain])[2] == [True] and bytes(plain) == payload(key, SIZE)
            before = spin_counts(c)
            if r == 0:
                first[op] = before[op]
            if op == "put":
                pool.views[0][:] = payload(key, SIZE)
                assert c.set([key], pool.views)[0]
            else:
                pool.views[0][:] = b"\0" * SIZE
                assert c.get([key], pool.views)[2] == [True] and bytes(pool.views[0]) == payload(key, SIZE)
            after = spin_counts(c)
            added.append({o: (after[o][0] - before[o][0], after[o][1] - before[o][1]) for o in ("put", "get")})
    return first, added


def one_op(op: str, spins: int) -> dict:
    """The counts of `added` expected of one slow op: `spins` spins of `op`, no hit, nothing of the other op."""
    return {o: ((spins, 0) if o == op else (0, 0)) for o in ("put", "get")}


@pytest.mark.parametrize(
    ("spin_us", "cpus", "runnable", "spins"),
    [(10000, 64, 0, True), (0, 64, 0, False), (10000, 1, 0, False), (10000, 64, 600, False), (None, 64, 0, True)],
    ids=str,
)
def test_a_worker_spins_for_its_reply_while_cpus_are_idle(monkeypatch, tmp_path, spin_us, cpus, runnable, spins):
    """Four rounds of slow_after_fast (a store and a load through the ring, then each again from or into a segment,
    ~100 ms at the gateway): the first fast store and load have no round trip to expect and are not spun for;
    each slow one, expected at the fast one's round trip, polls from at once and its reply comes ~90 ms after the
    spin's end: exactly one spin and no hit each (gateway_{put,get}_reply_spins, ..._hits), while connections x 2
    <= CPUs (ADP_TEST_CLIENT_CPUS 64; 1 fails it: 1 x 2 > 1) and runnable threads x 2 <= CPUs (0 read from
    ADP_TEST_LOADAVG_FILE; 600 x 2 > 64 fails it). reply_spin_us 0: never; None: the default (200 us), which spins
    too. Every load's bytes are its own either way, and the gateway answers every request. This counted spins and
    hits where the expectation met the reply, the spin starting ~3 ms before it: beside two busy loops (load 7.6,
    this 2-core VM) ('put', 1, 0) failed 1 <= hits, the worker woke after its reply (no spin) or the reply came past
    the 10 ms window (a miss). A spin catching its reply is timing by nature (a window of reply_spin_us, 10 ms at
    most): test_a_worker_stops_spinning_... asserts it, rounds until a probe catches one."""
    params = {} if spin_us is None else {"reply_spin_us": spin_us}
    with slow_gateway_and_worker(monkeypatch, tmp_path, 100, runnable, cpus, process_memory=False, **params) as (
        gw,
        pool,
        c,
    ):
        rounds = 4
        first, added = slow_after_fast(c, pool, rounds, "replyspin")
        served = stats(gw)
        assert served["batch_puts"] == served["batch_gets"] == 2 * rounds, served
        assert first == {"put": (0, 0), "get": (0, 0)}, first
        assert added == [one_op(op, 1 if spins else 0) for _ in range(rounds) for op in ("put", "get")], added


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the rule needs 2 CPUs for one connection")
@pytest.mark.parametrize(
    ("cpu_max", "spins"), [("100000 100000", False), ("150000 100000", True), ("max 100000", True)], ids=str
)
def test_a_containers_cpu_quota_is_counted_by_the_spin_rule(monkeypatch, tmp_path, cpu_max, spins):
    """The CPUs the rule counts are sched_getaffinity's (at least 2 here) or the cgroup's CPU quota where fewer
    (review r13 S2: a container on a big idle host spent its quota spinning): a cpu.max (ADP_TEST_CPU_MAX_FILE, not
    ADP_TEST_CLIENT_CPUS) of 1 CPU fails one connection's 1 x 2 <= CPUs, so no reply is spun for
    (gateway_*_reply_spins 0); 1.5 CPUs count as 2 (rounded up) and no quota ("max") as the affinity's, and each
    slow op of slow_after_fast spins once, as a wait expecting its reply later than now does. (This counted spins
    where the expectation met the reply: beside two busy loops ('get', 0) and ('put', 0) failed 1 <= n, the worker
    woke after its replies.)"""
    with slow_gateway_and_worker(
        monkeypatch, tmp_path, 100, 0, None, reply_spin_us=10000, cpu_max=cpu_max, process_memory=False
    ) as (_, pool, c):
        rounds = 3
        first, added = slow_after_fast(c, pool, rounds, "quota")
        assert first == {"put": (0, 0), "get": (0, 0)}, first
        assert added == [one_op(op, 1 if spins else 0) for _ in range(rounds) for op in ("put", "get")], added


def test_a_gateway_that_dies_while_a_worker_waits_to_spin_is_seen_at_once(monkeypatch, tmp_path):
    """A load the worker expects to take ~2 s (the gateway sleeps 2 s before the object; the stall check every
    5 s, ADP_TEST_STALL_CHECK_MS, so a 2 s reply is spun for): its wait sleeps until shortly before 2 s with the
    socket watched. The gateway killed 0.5 s into it: the future fails within a second of the kill, not at the
    expected reply's time nor at the deadline (20 s); the wait never polled, so it is no spin
    (gateway_get_reply_spins 0: review r13 N2, it was counted before the sleep)."""
    with slow_gateway_and_worker(monkeypatch, tmp_path, 2000, 0, 64, reply_spin_us=10000) as (gw, pool, c):
        pool.views[0][:] = payload("dies@0", SIZE)
        assert c.set(["dies@0"], pool.views)[0]
        assert c.get(["dies@0"], pool.views)[2] == [True]  # learnt: a load of this size takes ~2 s
        fid = c.conn.submit_batch_get(["dies@0"], list(pool.views))
        killer = threading.Timer(0.5, gw.kill)
        killer.start()
        killer.join()
        killed = time.monotonic()
        ok, _, per_key = c.wait(fid, timeout=15)
        seen = time.monotonic() - killed
        assert not ok and per_key == [False]
        assert seen < 1.0, f"the dead gateway was seen {seen:.2f} s after its kill"
        assert counted(c)["gateway_get_reply_spins"] == 0


def test_a_worker_stops_spinning_where_its_spins_miss_and_resumes_once_a_probe_catches_its_reply(monkeypatch, tmp_path):
    """review r13 S2 (32 MiB x 4: 98% of the waits spun, 1-4% caught the reply). The gateway sleeps 40 ms before
    each object; a load of one 256 KiB object (~40 ms) and one of eight 32 KiB objects (~320 ms) move the same
    bytes, so the worker's expectation for them is one (a low estimate: a sooner reply sets it, a later one
    moves it an eighth of the way). Alternating, each eight-object load is expected at ~40 ms: it polls from
    there for the 10 ms spin and misses, by far; each one-object load is expected at ~75 ms and answered while
    the worker sleeps, which is no spin. After 16 misses the worker pauses: of the 16 waits after, the last
    spins (a probe: an eight-object load, a one-object probe's reply coming in its sleep), and misses: 17 spins
    for 24 pairs, no hit (48 before: every wait counted).

    Then one-object loads until a probe catches its reply (its window ~10 ms around ~40 ms): paused, at most 1
    wait in 16 polls. Resumed, every wait that expects its reply later than now spins: 8 one-object loads, each
    after a load of the same object into plain memory (through the ring, process memory off: no segment, so no
    sleep; the expectation drops to ~0.1 ms), poll from at once for 10 ms, 30 ms before the reply: 8 spins in
    16 waits, where a paused worker polls once at most (counted around each one-object load: a fast load slowed
    past its expectation by the host spins too). (CI at 1f570e8, a loaded 2-core VM: counting the resumed worker's spins where the
    expectation met the reply failed, (17, 25, 8); the worker woke after its reply, which is no spin.)"""
    small = SIZE // 8
    pool = ShmPool(8, small)
    whole = memoryview(pool.map)
    pool.views.append(whole)  # released with them
    try:
        with slow_gateway_and_worker(monkeypatch, tmp_path, 40, 0, 64, reply_spin_us=10000, process_memory=False) as (
            gw,
            _,
            c,
        ):
            keys = [f"pause@{i}" for i in range(8)]
            for k, v in zip(keys, pool.views, strict=False):
                v[:] = payload(k, small)
            assert c.set(keys, pool.views[:8])[0]
            whole[:] = payload("pause@whole", SIZE)
            assert c.set(["pause@whole"], [whole])[0]

            def one() -> None:
                whole[:] = b"\0" * SIZE
                assert c.get(["pause@whole"], [whole])[2] == [True]
                assert bytes(whole) == payload("pause@whole", SIZE)

            def eight() -> None:
                whole[:] = b"\0" * SIZE
                assert c.get(keys, pool.views[:8])[2] == [True] * 8
                assert all(bytes(v) == payload(k, small) for k, v in zip(keys, pool.views, strict=False))

            plain = memoryview(bytearray(SIZE))

            def fast() -> None:  # through the ring: no segment, nothing to sleep for
                plain[:] = b"\0" * SIZE
                assert c.get(["pause@whole"], [plain])[2] == [True]
                assert bytes(plain) == payload("pause@whole", SIZE)

            one()  # learnt: ~40 ms; no spin (nothing expected)
            for _ in range(24):
                eight()
                one()
            spins, hits = spin_counts(c)["get"]
            assert (spins, hits) == (17, 0)
            waits = 0
            while hits == 0:
                assert waits < 96, ("no probe caught its reply", spins, waits)
                one()
                waits += 1
                spins, hits = spin_counts(c)["get"]
            assert hits == 1 and spins - 17 <= waits // 16 + 1, ("paused, more than the probes polled", spins, waits)
            polled = []  # each one-object load's spins; a fast load slowed past ~5 ms by the host may spin too
            for _ in range(8):
                fast()
                before, _ = spin_counts(c)["get"]
                one()
                polled.append(spin_counts(c)["get"][0] - before)
            assert polled == [1] * 8, ("resumed, a wait expecting its reply later did not spin", spins, polled)
    finally:
        pool.close()


def test_a_ring_load_in_pieces_does_not_spin(monkeypatch, tmp_path):
    """review r13 N2: a ring load in pieces (ring_pieces; plain buffers and process_memory off: neither segments
    nor process memory) reads its reply after copying the pieces, most of a round trip after its send: its wait
    is not spun for, so its loads count no spin (they did, every one but the first). The gateway sleeps 30 ms
    before each 1 MiB piece of a 3 MiB object; the loads' bytes are checked."""
    size = 3 << 20
    with slow_gateway_and_worker(
        monkeypatch,
        tmp_path,
        0,
        0,
        64,
        gateway_env={"ADP_TEST_RING_PIECE_DELAY_MS": 30},
        reply_spin_us=10000,
        process_memory=False,
    ) as (gw, _, c):
        src = payload("pieces@0", size)
        assert c.set(["pieces@0"], [memoryview(src)])[0]
        for _ in range(4):
            out = bytearray(size)
            assert c.get(["pieces@0"], [memoryview(out)])[2] == [True]
            assert bytes(out) == src
        assert spin_counts(c)["get"] == (0, 0)
        assert read_gateway_stats(gw.unix_url)["ring_piece_loads"] >= 4
