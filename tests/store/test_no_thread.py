# SPDX-License-Identifier: Apache-2.0
"""A card's open where no thread can be started (a container's pids limit, or memory: here an address-space limit
on a child process with no room for a thread's 8 MiB stack) opens the card all the same. Recovery's scan threads
(store/recovery.cc, scan_regions) and a tmpfs card's prefault thread (CardDevice::start_prefault) threw
std::system_error out of the open: a scan thread that failed after another had started ended the process
(std::terminate: a joinable std::thread destroyed), one that failed first, or the prefault thread, failed the open.
Now recovery walks the card with the threads it got, or on the opening thread, and the prefault is skipped (a
WARNING each); the card's objects load back and a store is taken."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lmcache_adp import CardStore
from tests.helpers import MIB
from tests.support import cpp

CHILD = r"""
import resource, sys
from lmcache_adp import CardStore
card, room = sys.argv[1], int(sys.argv[2])
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm + room, hard))  # no room for a thread's 8 MiB stack
s = CardStore(card)
assert all(s.get(f"k{i}") == bytes([i]) * 8192 for i in range(8))
s.put("after", b"z" * 8192)
assert s.get("after") == b"z" * 8192
s.close()
print("opened and served")
"""


def open_without_threads(card: str, room: int) -> subprocess.CompletedProcess:
    """Writes the card here and opens it in a child that has started no thread (glibc keeps the stacks of a
    process's ended threads for its next ones)."""
    s = CardStore(card, MIB + 16 * MIB, region_bytes=MIB)
    for i in range(8):
        s.put(f"k{i}", bytes([i]) * 8192)
    s.close()
    env = dict(os.environ, ADP_LOG_LEVEL="WARNING")
    return subprocess.run(
        [sys.executable, "-c", CHILD, card, str(room)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("room", "started"), [(4 * MIB, 0), (12 * MIB, 1)], ids=["none", "one"])
def test_recovery_walks_with_the_scan_threads_it_got(tmp_path, room, started):
    """none: the opening thread walks the card (the old code failed the open); one: a thread's stack fits, the
    second does not, and that one walks it (the old code ended the process: std::terminate)."""
    card = str(tmp_path / "card.img")  # a disk card: no mapping, no prefault thread
    r = open_without_threads(card, room)
    assert r.returncode == 0 and "opened and served" in r.stdout, f"rc {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert f"{started} of 4 scan threads started" in r.stderr, r.stderr[-3000:]


def test_a_tmpfs_card_opens_without_its_prefault_thread_when_none_can_be_started():
    assert os.access("/dev/shm", os.W_OK), "this test needs a writable /dev/shm (tmpfs: the mapped card)"
    with tempfile.TemporaryDirectory(prefix="adp-nothread-", dir="/dev/shm") as d:
        card = os.path.join(d, "card.img")  # mapped: room for its 17 MiB mapping, none for a thread's stack
        r = open_without_threads(card, 17 * MIB + 4 * MIB)
    assert r.returncode == 0 and "opened and served" in r.stdout, f"rc {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "no thread to map its written extents in ahead" in r.stderr, r.stderr[-3000:]
    assert "cannot map the image" not in r.stderr, r.stderr[-3000:]  # the mapping was made: the prefault was due


# thread_alloc_test links the store, the gateway and the connector with its transports.
ALLOC_TEST_DIRS = ("store", "util", "testing", "gateway", "protocol", "connector", "transport")


@pytest.fixture(scope="module")
def thread_alloc_test(tmp_path_factory) -> Path:
    return cpp.build("thread_alloc_test", tmp_path_factory.mktemp("thread-alloc"), ALLOC_TEST_DIRS)


def run_part(binary: Path, part: str, timeout: float = 300) -> str:
    assert os.access("/dev/shm", os.W_OK), "this test needs a writable /dev/shm (tmpfs: the mapped card, the socket)"
    with tempfile.TemporaryDirectory(prefix="adp-nothread-", dir="/dev/shm") as d:
        return cpp.run(binary, d, part, timeout=timeout)


def test_a_thread_start_that_fails_for_memory_is_done_without(thread_alloc_test):
    """std::bad_alloc from std::thread's allocation of its state (injected by the program's operator new), as
    std::system_error above: the CRC worker's CRC computed on the caller's thread, a tmpfs card's prefault skipped
    (tests/cpp/thread_alloc_test.cc)."""
    out = run_part(thread_alloc_test, "store")
    # Session 29 (gwstop29 item 3): the card's prefault thread, a segment's background populate and recovery's scan
    # threads, each allocation on them failed in turn. Red on ca1965b: rc 134, 'terminate called after throwing an
    # instance of 'std::bad_alloc'' (nothing caught on those threads).
    assert "allocations on the card's prefault thread failed: the process lives" in out, out[-3000:]
    assert "allocations of a segment's background populate failed: the thread went on" in out, out[-3000:]
    assert "allocations on recovery's scan threads failed: the open failed with the reason" in out, out[-3000:]


def test_a_connection_the_gateway_cannot_make_room_for_is_refused_and_the_next_served(thread_alloc_test):
    """Each allocation of accept_one on the accept thread (the connection's entry, its control block, its thread's
    state) failed in turn: that connection gets the Error 'the gateway cannot start a thread for this connection
    (out of memory: std::bad_alloc)', refused_connections counts it, and the next connection is served. Red on
    905bc86: the first failure left the accept loop (std::terminate, the gateway gone for every client)."""
    out = run_part(thread_alloc_test, "gateway")
    assert "3 allocations at accept failed" in out, out[-3000:]
    # Session 30 (accepterr30): each failure followed by every allocation after it on the accept thread (memory that
    # stays out): the Error frame still goes (made in place). Red on 5f6f8c7's sources: "allocation 0 at accept
    # failed: frame -1, ''" (the frame's text and body allocated: the connection closed without it).
    assert "3 allocations at accept failed, each with every one after it, each connection refused" in out, out[-3000:]
    # Session 25 (gwexc25 item 4): ADP_TEST_ACCEPT_THREAD_FAIL=system|alloc: Start returns the reason, the card closed
    # (a gateway starts on it next). Red with the catch in GatewayServer::Start rethrowing: 'Start threw ...'.
    assert "a start whose accept thread failed returned the reason, its card closed" in out, out[-3000:]


def test_an_exception_on_a_connections_thread_ends_that_connection_only(thread_alloc_test):
    """Session 25 (gwexc25 item 1): each allocation on a connection's thread (adp-conn-*: handshake, process
    registration, a process put and get, Stats, teardown) failed in turn, those inside a card store operation left
    alone: that connection ends (ERROR with its peer, the Error 'the gateway failed serving this connection (out of
    memory: std::bad_alloc)'), failed_connections counts it, clients, ring bytes, processes, store buffers, load holds
    and piece callers are back to 0, and the next connection is served. Red with ClientHandler::run's catch
    rethrowing (the old code had none): rc 134, 'terminate called after throwing an instance of std::bad_alloc'."""
    out = run_part(thread_alloc_test, "connection")
    assert "connections failed" in out and "each given back, the next served" in out, out[-3000:]
    assert "ERROR: gateway: client #1 (unix pid " in out, out[-3000:]
    # Session 30 (accepterr30): the same with every allocation after the failed one failing too (memory that stays
    # out): each session the failure ended still gets the Error (its frame made in place), and each failed connection
    # still has its ERROR line (its peer's text made in place). Red on 5f6f8c7's sources: "let 0: a session the
    # failure ended not told why: ''" (64 sessions, 0 told why) and 65 ERROR lines for 130 failed connections (the
    # others "its end could not be logged (out of memory)").
    assert "failed, each with every one after it:" in out, out[-3000:]
    failed = sum(int(n) for n in re.findall(r"failed[^:]*: (\d+) connections failed", out))
    lines = out.count("the gateway failed serving this connection (out of memory: std::bad_alloc); closing the")
    assert failed > 0 and lines == failed, f"{lines} ERROR lines for {failed} failed connections\n{out[-3000:]}"


def test_a_connector_whose_thread_cannot_be_started_fails_with_the_reason(thread_alloc_test):
    """Each allocation of the Connector's construction failed in turn: a worker's or the deadline thread's state is
    a runtime_error 'ADPConnector: cannot start its worker thread 2 of 3 (out of memory: std::bad_alloc)' (Python:
    RuntimeError), the threads it started joined. Red on 905bc86: std::terminate at the second worker's."""
    run_part(thread_alloc_test, "connector")


def test_a_remote_backend_goes_on_without_its_connect_and_reconnect_threads(thread_alloc_test):
    """RemoteSession::prepare whose thread's state fails: no exception, the first batch connects on its own; a
    batch's outage whose background reconnect thread cannot be made: the batch gets the outage; each allocation on
    the start-up connect's thread failed in turn: none leaves it. Red on 905bc86: prepare threw std::bad_alloc, the
    batch threw it, and the start-up connect's thread ended the process (std::terminate)."""
    out = run_part(thread_alloc_test, "remote")
    # Session 29 (allocinfo29): the part logs at DEBUG, and each allocation on the start-up connect's thread fails
    # with every one after it (memory that stays out): the catch's DEBUG line's description (a std::string) fails
    # too. Red on 42ed98e's remote_backend.cc: rc 134, 'terminate called after throwing an instance of
    # 'std::bad_alloc'' (the line made in the catch, outside any try).
    assert "on the start-up connect's thread failed, each with every one after it, none left it" in out, out[-3000:]
    # Session 30 (accepterr30): a connection the gateway fails for want of memory that stays out tells the connector
    # why: its lookup fails "gateway refused: the gateway failed serving this connection (out of memory:
    # std::bad_alloc)", and its outage line says so. Red on 5f6f8c7's sources: "let 1: the lookup failed without the
    # reason: 'gateway ... unavailable: connection closed'" (let 0: "receive failed: Connection reset by peer"), the
    # WARNING "connection closed; its requests fail until it is back".
    assert "lookups failed with the gateway's reason" in out, out[-3000:]
    assert "gateway refused: the gateway failed serving this connection (out of memory" in out, out[-3000:]


def test_a_batch_of_a_worker_without_a_session_keeps_the_reason(thread_alloc_test):
    """Session 31 (brief start31 task 3): a batch failed because its worker has no backend session completed with
    "worker has no backend session" alone (the reason in a rate-limited ERROR line only). Now the reason comes with
    it, made without allocating: a test double's new_session() throwing a runtime_error, then std::bad_alloc with 8
    more allocations on the worker's thread failing after it; the next batch is served."""
    out = run_part(thread_alloc_test, "no_session")
    assert "batches of a worker without a session failed with the reason (" in out, out[-3000:]
    assert "'worker has no backend session (out of memory: std::bad_alloc)'" in out, out[-3000:]


def test_a_connector_worker_goes_on_after_an_exception(thread_alloc_test):
    """Session 26 (gwexc26 item 1): a worker whose session's prepare() throws (a test double) serves its batches;
    each allocation on a worker's thread (adp-worker-0) failed in turn for a store and a load: each future completes,
    ok or failed with 'the connector's worker failed this batch (out of memory: std::bad_alloc)', and the next batch
    is served. Red before session 26: std::terminate (prepare() and the slice's taking were outside any try)."""
    out = run_part(thread_alloc_test, "worker")
    assert "a worker whose session's prepare threw served its batch" in out, out[-3000:]
    assert "batches failed with the reason, the next served" in out, out[-3000:]
    # Session 30 (accepterr30): each failure followed by 8 more on the worker's thread (the reason's text among them):
    # a failed batch still completes with the reason, made in place. Red on 5f6f8c7's connector.cc: "let 11: a
    # batch's completion: 0 'the connector failed this batch (no memory for the reason)'".
    assert "each with 8 after it:" in out and "no memory for the reason" not in out, out[-3000:]
    assert "ERROR: ADPConnector: worker 0: a set batch of 2 keys failed on an exception (out of memory" in out, out[
        -3000:
    ]


def test_the_connector_deadline_thread_goes_on_after_an_exception(thread_alloc_test):
    """Session 27 (gwexc27 item 2): each allocation on the connector's deadline thread (adp-deadline: a batch's
    time-out, its completion, its retirement) failed in turn while the worker holds the batch: the future completes
    all the same, failed 'timed out after 1000 ms' with no key stored (the failure waited out: ERROR, a pause, tried
    again), the thread goes on and the next batch is served. Red on c04fcc0 (publish_locked's allocations outside
    any try): rc 134, 'terminate called after throwing an instance of 'std::bad_alloc''."""
    out = run_part(thread_alloc_test, "deadline")
    assert "on the deadline thread failed: each batch timed out all the same, the next served" in out, out[-3000:]
    assert "ERROR: ADPConnector: the deadline thread has no memory to time out a batch (std::bad_alloc)" in out, out[
        -3000:
    ]


def test_connector_close_and_destructor_throw_nothing_and_fail_every_pending_batch(thread_alloc_test):
    """Session 28 (gwexc28 item 1): each allocation of Connector::close() with three store batches pending failed in
    turn, then each of ~Connector's: the process lives, close() throws nothing, and one drain() after it holds every
    batch's completion once, failed 'connector closed' with no key stored (a completion close() had no memory for is
    made by the drain); each allocation of ~CardStore (its clean close's pad) failed in turn: the next open reads the
    object. Red on 688c95a: 'terminate called without an active exception' (close() threw, ~Connector destroyed its
    running threads) and, for ~CardStore, 'terminate called after throwing an instance of 'std::bad_alloc''."""
    out = run_part(thread_alloc_test, "close")
    assert "of close() with 3 batches pending failed: the process lives, every future completed once" in out, out[
        -3000:
    ]
    assert "of ~Connector with 3 batches pending failed: the process lives" in out, out[-3000:]
    # gwexc28 item 2: ~CardStore's pad at a clean close without memory is left to the next open.
    assert "of ~CardStore failed: the process lives, the next open reads the object" in out, out[-3000:]
    assert "no memory to pad the frontier region's tail at close: the next open pads it" in out, out[-3000:]
    assert "destructors: ~SegmentPrefaulter, ~IoContext and ~CardDevice allocate nothing" in out, out[-3000:]
    # Session 29 (gwstop29 item 2): a submit() without memory, after close() or before, refuses its batch and has
    # freed it (its owner: the caller's buffers) by the throw. Red on ca1965b: 'closed, let 3: the refused batch's
    # owner freed 0 times at the throw' (kept in live_ until ~Connector).
    assert "of submit() after close() failed:" in out and "each batch freed at once" in out, out[-3000:]
    assert "of submit() on an open connector failed:" in out, out[-3000:]


def test_a_gateway_stops_and_closes_its_card_without_memory(thread_alloc_test):
    """Session 29 (gwstop29 item 1): each allocation of a gateway's stop on its accept thread failed in turn (a
    client connected with an object stored, a status query connected, a connection in its handshake), then each of
    ~GatewayServer's: stop() finishes, the socket file is removed and the card closed (it opens again and the object
    reads back; a clean close's pad without memory is left to the next open, with its ERROR line). Red on ca1965b:
    rc 134, 'terminate called after throwing an instance of 'std::bad_alloc'' (the stopping line's handshake count
    made outside any try on the accept thread)."""
    out = run_part(thread_alloc_test, "gateway_stop")
    assert "of the accept thread's stop failed in turn: each stopped, its socket removed, its card closed" in out, out[
        -3000:
    ]
    assert "of ~GatewayServer failed in turn: each stopped" in out, out[-3000:]
    # The one allocation left on the stop, the card's clean-close pad, done without: the next open pads the tail.
    assert (
        "ERROR: card " in out and "no memory to pad the frontier region's tail at close: the next open pads it" in out
    )


def test_the_background_reconnect_goes_on_after_an_exception(thread_alloc_test):
    """Session 26 (gwexc26 item 1): each allocation on the reconnect thread (adp-reconnect) failed in turn while no
    gateway answers: a failed attempt (ERROR, back-off), and once a gateway answers at the socket the thread connects
    by itself (gateway_reachable with no batch). Red before session 26: std::terminate (nothing caught in
    reconnect_loop)."""
    out = run_part(thread_alloc_test, "reconnect")
    assert "each a failed attempt, then connected" in out, out[-3000:]
    assert "the background reconnect's attempt failed on an exception (out of memory: std::bad_alloc)" in out, out[
        -3000:
    ]


def test_an_exception_on_a_store_reader_fails_that_store_only(thread_alloc_test):
    """Session 26 (gwexc26 item 2): each allocation on a connection's store reader (adp-gw-sread-*: a pipelined
    store's read of a 9 MiB object) failed in turn: that store is answered 'out of memory: the gateway failed
    reading this object from the client's memory (std::bad_alloc)' (or stored), store_reader_failures counts it, the next
    store and load on the connection are served (the lease given back), no connection failed. Red before session 26:
    std::terminate on the reader's thread."""
    out = run_part(thread_alloc_test, "reader")
    assert "the connection and its reader went on" in out, out[-3000:]


def test_an_allocation_failure_inside_a_store_operation_leaves_the_store_as_if_it_failed(thread_alloc_test):
    """Session 26 (storeexc26): a sequence of card store operations (puts of two sizes, one through a fill and two in
    one put_each, loads, a delete, a replacement, puts that evict) run once for each of its allocations, that one
    failing: afterwards no operation hangs, every key reads one of its values or a miss, no delete is refused (no
    store left in flight), the counts match the loads, and a reopen deletes every key down to 0 bytes used. Red on
    029a20f (the store of main, this test): 'run 7 (allocation 8 failed) hung: no progress in 60 s'. Session 27
    (storevoid27): every key is deleted right after the faulted sequence and the card reopened: each must be a miss.
    Red on c04fcc0's store: 'run 71 (allocation 72 failed): sweep/d, deleted before the reopen, came back after it'
    (a replacement put failed after its write: its copy, never voided, outranked the delete's tombstone) and
    'run 88 (allocation 89 failed): sweep/h0, ...' (a put failed late, the key not indexed: no delete marked it)."""
    # ~270 runs of the sequence, each with a reopen: 34 s of CPU, 3.5 min wall beside a build (session 26), so
    # more room than cpp.run's default on a loaded CI host; its own watchdog still ends a hung run after 60 s.
    out = run_part(thread_alloc_test, "sweep", timeout=900)
    assert "allocations of the sequence failed in turn" in out, out[-3000:]
