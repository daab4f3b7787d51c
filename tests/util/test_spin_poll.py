# SPDX-License-Identifier: Apache-2.0
"""spin_poll (src_cpp/util/idle_cpus.h), the sleepless poll of the gateway's --request-spin-us and the connector's
reply_spin_us: a signal that interrupts one of its polls does not end the spin as an error (review r14a N4); it
ends when the socket is readable or hung up, or at its end with nothing.

Builds tests/cpp/spin_poll_test.cc (header only: no src_cpp sources) and runs it."""

from __future__ import annotations

from tests.support import cpp


def test_spin_poll(tmp_path):
    cpp.run(cpp.build("spin_poll_test", tmp_path, ()), timeout=60)
