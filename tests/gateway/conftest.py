# SPDX-License-Identifier: Apache-2.0
"""Gateway daemons for the tests (tests/support/gateway.py): on a short
temporary directory and, for the `gateway` fixture, TCP on a free port too;
`card_gateway` on a tmpfs card and on a file card (/tmp) in turn."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.support.gateway import Gateway, temp_gateway


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


@pytest.fixture(params=["tmpfs", "disk"])
def card_gateway(request):
    """A gateway on a tmpfs card (it reads and writes the card's mapping in place), then on one in /tmp (through
    staging)."""
    with temp_gateway(memory=request.param == "tmpfs") as gw:
        yield gw
