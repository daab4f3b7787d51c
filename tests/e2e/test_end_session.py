# SPDX-License-Identifier: Apache-2.0
"""VLLMClient.end_request waits for the server's answer to END_SESSION.

Without the wait, a close() right after the last request can let
UNREGISTER_KV_CACHE overtake END_SESSION on the server's thread pool, and the
server logs an ERROR (the image test's flaky failure). The race itself needs a
slow server thread; these tests hold the answer back with a scheduler double
shaped like each LMCache release's adapter and check that end_request does not
return before it. The real adapters are covered by tests/e2e/test_mp_server.py,
whose end_request calls fail if END_SESSION no longer goes where it is caught.
"""

from __future__ import annotations

import enum
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

pytest.importorskip("lmcache")

from lmcache_adp.testing.client import VLLMClient  # noqa: E402


class _RequestClient:  # LMCache 0.5.6: scheduler.req_clients[url].end_session(rid) -> future
    def __init__(self) -> None:
        self.future: Future = Future()
        self.sent: list[str] = []

    def end_session(self, request_id: str) -> Future:
        self.sent.append(request_id)
        return self.future


class _MQClient:  # LMCache 0.5.4: send_lmcache_request -> mq_client.submit_request(type, payloads, cls)
    def __init__(self) -> None:
        self.future: Future = Future()
        self.sent: list[object] = []

    def submit_request(self, request_type, payloads, response_class=None) -> Future:
        self.sent.append(request_type)
        return self.future


def _scheduler_056(rc: _RequestClient) -> SimpleNamespace:
    sched = SimpleNamespace(req_clients={"url": rc}, is_healthy=True, cleaned=[])
    sched.end_session = lambda rid: sched.req_clients["url"].end_session(rid) and None
    sched.cleanup_lookup_result = sched.cleaned.append
    return sched


class RequestType(enum.Enum):  # as 0.5.4's lmcache.v1.multiprocess.protocol has it (not in 0.5.6)
    LOOKUP = 1
    END_SESSION = 2


def _scheduler_054(mq: _MQClient) -> SimpleNamespace:
    sched = SimpleNamespace(mq_clients={"url": mq}, is_healthy=True, cleaned=[])
    sched.end_session = lambda rid: sched.mq_clients["url"].submit_request(RequestType.END_SESSION, [rid]) and None
    sched.cleanup_lookup_result = sched.cleaned.append
    return sched


def _client(scheduler: SimpleNamespace) -> VLLMClient:
    client = VLLMClient.__new__(VLLMClient)  # no server: only the scheduler is used
    client.scheduler = scheduler
    client.timeout = 10.0
    return client


@pytest.mark.parametrize("release", ["0.5.6", "0.5.4"])
def test_end_request_returns_only_after_the_answer(release):
    rpc = _RequestClient() if release == "0.5.6" else _MQClient()
    sched = _scheduler_056(rpc) if release == "0.5.6" else _scheduler_054(rpc)
    client = _client(sched)
    done = threading.Event()
    t = threading.Thread(target=lambda: (client.end_request("req-1"), done.set()))
    t.start()
    try:
        assert not done.wait(0.5), "end_request returned before the server answered END_SESSION"
        assert len(rpc.sent) == 1
    finally:
        rpc.future.set_result(None)
        t.join(10)
    assert done.is_set()
    assert sched.cleaned == ["req-1"]
    # The wrapper is gone again: the RPC object's own method is back.
    assert "end_session" not in vars(rpc) and "submit_request" not in vars(rpc)


def test_end_request_fails_when_the_adapter_changed():
    sched = SimpleNamespace(end_session=lambda rid: None, cleanup_lookup_result=lambda rid: None)
    with pytest.raises(RuntimeError, match="neither req_clients nor mq_clients"):
        _client(sched).end_request("req-1")


def test_end_request_fails_when_end_session_went_elsewhere():
    sched = _scheduler_056(_RequestClient())
    sched.end_session = lambda rid: None  # sends nothing through req_clients
    with pytest.raises(RuntimeError, match="did not go through"):
        _client(sched).end_request("req-1")
