# SPDX-License-Identifier: Apache-2.0
"""What the tests read from an MP server's log, beside the public helper's
counters: LMCache's per-lookup report of where the chunks came from, a second
witness that a restore came from L2 (the card) and not from L1."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from lmcache_adp.testing import MPServer, Restore

# lmcache 0.5.x, storage_manager.query_prefetch_status (an INFO line; MPServer logs INFO):
#   "Prefetch request completed (L1+L2): 4/4 retained keys (0 L1, 4 L2) in 3.1 ms
#    (external_request_id=..., prefetch_request_id=...)"
_PREFETCH_LINE = re.compile(
    r"Prefetch request completed \(L1\+L2\): (\d+)/(\d+) retained keys "
    r"\((\d+) L1, (\d+) L2\) in ([0-9.]+) ms \(external_request_id=([^,]+),"
)


@dataclass(frozen=True)
class Prefetch:
    """What the server logged for one lookup (in chunks)."""

    hits: int
    requested: int
    from_l1: int
    from_l2: int
    ms: float


def prefetch(server: MPServer, request_id: str, timeout: float = 10.0) -> Prefetch | None:
    """The server's log line for the lookup with this request id (None if it logged none in time)."""
    deadline = time.monotonic() + timeout
    while True:
        for m in _PREFETCH_LINE.finditer(server.log()):
            if m.group(6) == request_id:
                hits, req, l1, l2 = (int(m.group(i)) for i in range(1, 5))
                return Prefetch(hits, req, l1, l2, float(m.group(5)))
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def assert_restored_from_card(server: MPServer, r: Restore) -> Prefetch:
    """Every token hit with the stored bytes, and every chunk came from L2 by the
    server's counter and by its log line for the lookup; returns that line."""
    assert r.hit_tokens == r.tokens, f"{r.hit_tokens}/{r.tokens} tokens hit"
    assert r.retrieved, "the worker reported failed blocks"
    assert r.identical, "retrieved KV differs from the stored KV"
    assert r.l2_loaded_chunks == r.hit_chunks, f"the server's L2-load counter says {r.l2_loaded_chunks}: {r}"
    p = prefetch(server, r.request_id)
    assert p is not None, f"the server logged no prefetch for {r.request_id}:\n{server.log_tail()}"
    assert (p.hits, p.from_l1, p.from_l2) == (r.hit_chunks, 0, r.hit_chunks), p
    assert r.from_l2
    return p
