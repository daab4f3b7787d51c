# SPDX-License-Identifier: Apache-2.0
"""VLLMClient.close() gives back the KV cache's /dev/shm segments at once.

LMCache moves a CPU client's KV tensors into POSIX shared memory (/dev/shm/lmcache_kv_<pid>_<n>) when they
are registered, and frees a segment only when its tensors are collected; its adapters hold them in
reference cycles. bench_restore.py makes one client per tier (1 GiB of KV each): without the release in
close(), eight tiers held 7 GiB of /dev/shm until the machine ran out of memory."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

pytest.importorskip("lmcache")

from lmcache_adp.testing import KVShape, MPServer, VLLMClient, store_prompt  # noqa: E402

pytestmark = [pytest.mark.lmcache, pytest.mark.slow]

SHAPE = KVShape(num_layers=2, num_heads=2, head_dim=64, block_size=16, num_blocks=40)


def kv_segments() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"lmcache_kv_{os.getpid()}_*"))


def test_close_frees_the_kv_segments(tmp_path):
    mock = {"type": "mock", "max_size_gb": 1, "mock_bandwidth_gb": 1000}
    before = kv_segments()
    gc.disable()  # the release must not depend on when Python's cyclic GC happens to run
    try:
        with MPServer([mock], tmp_path, l1_size_gb=0.5) as server:
            for _ in range(2):
                with VLLMClient(server.url, SHAPE) as client:
                    store_prompt(server, client, 256)
                    assert len(kv_segments()) == len(before) + SHAPE.num_layers, "the KV is not in /dev/shm"
                assert kv_segments() == before, "closed client's KV segments are still in /dev/shm"
    finally:
        gc.enable()
