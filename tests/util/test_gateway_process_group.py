# SPDX-License-Identifier: Apache-2.0
"""A test gateway (tests/support/gateway.py) runs in a process group of its own (tests/support/process_group.py):
its kill(), and a stop whose wait times out, end every process it started, not only the gateway itself. Before
(session 26), a plain subprocess.Popen: a timed-out gateway test left the gateway's own children running."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.sanitizers.test_process_group import FORKER, assert_ended, written_pids
from tests.support.gateway import Gateway

# FORKER (a parent and its forked child sleeping 600 s, their pids written to a file), after the ready line the
# launcher waits for.
READY_FORKER = 'print("gateway ready (pid 1) on unix://x", flush=True)\n' + FORKER


class ForkingGateway(Gateway):
    """A Gateway whose process is FORKER, not `lmcache-adp gateway`."""

    def __init__(self, workdir: Path):
        super().__init__(workdir)
        self.pid_file = Path(workdir) / "pids"

    def args(self, *extra: str) -> list[str]:
        return [sys.executable, "-c", READY_FORKER, str(self.pid_file)]


def test_a_killed_gateway_leaves_no_process_it_started(tmp_path):
    gw = ForkingGateway(tmp_path).start(timeout=60)
    pids = written_pids(gw.pid_file)
    gw.kill()
    assert_ended(pids)


def test_a_gateway_whose_stop_times_out_leaves_no_process_it_started(tmp_path):
    gw = ForkingGateway(tmp_path).start(timeout=60)
    pids = written_pids(gw.pid_file)
    gw._finish(timeout=0.5)  # stop()'s wait, timed out: the process never exits by itself
    assert_ended(pids)
