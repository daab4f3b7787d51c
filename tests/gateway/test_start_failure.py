# SPDX-License-Identifier: Apache-2.0
"""A gateway whose accept thread cannot be started (a pids limit: std::system_error; no memory for the thread's
state: std::bad_alloc) is a start-up error with its reason: `lmcache-adp gateway` exits 1 and leaves neither the
socket file nor the card image it created (session 25, gwexc25 item 4). ADP_TEST_ACCEPT_THREAD_FAIL makes that
start fail (docs/testing.md); tests/cpp/thread_alloc_test.cc checks GatewayServer::Start itself."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from lmcache_adp.testing import child_env
from tests.support.gateway import Gateway


@pytest.mark.parametrize(
    ("how", "reason"), [("system", os.strerror(errno.EAGAIN)), ("alloc", "out of memory: std::bad_alloc")]
)
def test_a_gateway_whose_accept_thread_cannot_start_exits_with_the_reason(workdir, how, reason):
    """Before: GatewayServer::Start threw; std::bad_alloc reached Python as MemoryError, past the CLI's handling of a
    failed start (a traceback, the card image it created left behind)."""
    gw = Gateway(workdir)
    env = {**child_env(), "ADP_TEST_ACCEPT_THREAD_FAIL": how}
    r = subprocess.run(gw.args(), capture_output=True, text=True, timeout=60, env=env, cwd=workdir)
    assert r.returncode == 1, r.stderr
    assert f"gateway not started: the gateway cannot start its accept thread ({reason})" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert not os.path.lexists(gw.socket), "the socket file of a failed start was left behind"
    assert not os.path.exists(gw.card) and f"removed the card image {gw.card}" in r.stderr, r.stderr
