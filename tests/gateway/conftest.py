# SPDX-License-Identifier: Apache-2.0
"""Gateway daemons for the tests (tests/support/gateway.py): on a short
temporary directory and, for the `gateway` fixture, TCP on a free port too."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.support.gateway import Gateway


@pytest.fixture
def workdir():
    # Short: a Unix socket path has at most 107 bytes.
    d = tempfile.mkdtemp(prefix="adpgw-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def gateway(workdir):
    gw = Gateway(workdir, tcp=True).start()
    yield gw
    if gw.proc:
        gw.kill()
