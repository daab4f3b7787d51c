# SPDX-License-Identifier: Apache-2.0
"""An open waits for its walk, not for a poll (src_cpp/store/recovery.cc, scan_regions): the main thread is woken by
its recovery threads' exit. It used to sleep 20 ms between looks at them, so every open's walk took at least 20 ms,
in 20 ms steps. A tiny card's walk is a few reads: the median of its opens' recovery_seconds, the store's own
measure, is far below one such step (a median, so a single open slowed by the shared machine does not decide)."""

from __future__ import annotations

import statistics

from lmcache_adp import CardStore

MIB = 1 << 20
OLD_POLL_S = 0.020


def test_the_open_of_a_tiny_card_does_not_wait_for_a_poll_period(tmp_path):
    card = str(tmp_path / "card.img")
    s = CardStore(card, 64 * MIB)
    s.put("k", b"v" * 5000)
    s.close()
    walks = []
    for _ in range(15):
        s = CardStore(card, 64 * MIB)
        walks.append(s.stats()["recovery_seconds"])
        assert s.get("k") == b"v" * 5000
        s.close()
    assert statistics.median(walks) < OLD_POLL_S / 2, walks
