# SPDX-License-Identifier: Apache-2.0
"""The gateway's Unix socket file is group-only (0660) from its bind on, whatever the umask, and a chmod that fails
is a start-up error (session 23, gwreview23)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess

import pytest

from lmcache_adp.testing import child_env
from tests.helpers import eventually
from tests.support.gateway import READY, Gateway


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_the_socket_is_never_wider_than_group_only(workdir, umask):
    """gwreview23: the socket was chmod'ed to 0660 after bind and listen, so under umask 0 a watcher saw it 0777,
    and listening, before the chmod. ADP_TEST_SOCKET_BIND_GATE holds the gateway right after bind(2): the file is
    already no wider than 0660 there (fchmod before bind), nobody can connect yet, and once ready it is 0660
    exactly (a narrower umask undone)."""
    gw = Gateway(workdir)
    gate = os.path.join(workdir, "gate")
    log_path = os.path.join(workdir, "held.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            gw.args(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**child_env(), "ADP_TEST_SOCKET_BIND_GATE": gate},
            cwd=workdir,
            umask=umask,
        )
    try:
        assert eventually(lambda: os.path.lexists(gw.socket), 60), open(log_path).read()
        held = os.lstat(gw.socket).st_mode
        assert proc.poll() is None and not os.path.exists(gate)  # still held at the gate: bound, not chmod'ed
        with socket.socket(socket.AF_UNIX) as c, pytest.raises(ConnectionRefusedError):
            c.connect(gw.socket)  # not listening yet
        assert stat.S_ISSOCK(held)
        assert stat.S_IMODE(held) == 0o660 & ~umask, f"bound with mode {oct(stat.S_IMODE(held))} under umask {umask:o}"
        open(gate, "w").close()
        assert eventually(lambda: READY.search(open(log_path).read()), 60), open(log_path).read()
        assert stat.S_IMODE(os.lstat(gw.socket).st_mode) == 0o660
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert not os.path.lexists(gw.socket)


def test_a_failed_chmod_of_the_socket_stops_the_start(workdir):
    """gwreview23: chmod's result was ignored, and a socket the gateway could not make group-only served with
    whatever mode bind gave it. Now the start fails (exit 1, the reason given) and leaves neither the socket
    file nor the card image it created."""
    gw = Gateway(workdir)
    env = {**child_env(), "ADP_TEST_SOCKET_REFUSE_CHMOD": "1"}
    r = subprocess.run(gw.args(), capture_output=True, text=True, timeout=60, env=env, cwd=workdir)
    assert r.returncode == 1, r.stderr
    assert f"gateway not started: cannot make the socket group-only (chmod 0660) on unix://{gw.socket}: " in r.stderr, (
        r.stderr
    )
    assert not os.path.lexists(gw.socket), "the socket file of a failed start was left behind"
    assert not os.path.exists(gw.card) and f"removed the card image {gw.card}" in r.stderr, r.stderr
