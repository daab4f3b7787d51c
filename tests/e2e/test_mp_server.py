# SPDX-License-Identifier: Apache-2.0
"""End to end: a real `lmcache server` with the card as its L2 tier, driven
through the client classes vLLM's LMCacheMPConnector uses (CPU KV tensors).

Each test starts its servers on free ports and stops them by PID. Every test
runs with the embedded card and through the gateway daemon; a gateway that
does not start fails the test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache")

from lmcache_adp.gateway_stats import read_gateway_stats  # noqa: E402
from lmcache_adp.testing import (  # noqa: E402
    KVShape,
    MPServer,
    VLLMClient,
    adp_adapter,
    drop_l1,
    prompt,
    restore_prompt,
    store_prompt,
)
from tests.support.gateway import Gateway, temp_gateway  # noqa: E402
from tests.support.mp_server import assert_restored_from_card  # noqa: E402

pytestmark = [pytest.mark.lmcache, pytest.mark.slow]

# 4 layers x 2 KV heads x 64 x fp16: 2 KiB per token, 512 KiB per 256-token chunk.
SHAPE = KVShape(num_layers=4, num_heads=2, head_dim=64, block_size=16, num_blocks=160)
TOKENS = 1024  # 4 chunks
CARD_GB = 0.25


@dataclass
class L2Tier:
    """The card as LMCache sees it (its --l2-adapter spec), embedded or behind a gateway."""

    mode: str
    card: Path
    gateway: Gateway | None = None

    def adapter(self) -> dict[str, Any]:
        if self.gateway is None:
            return adp_adapter(card=str(self.card), card_size_gb=CARD_GB)
        return adp_adapter(gateway=self.gateway.url)

    def restart_gateway(self) -> None:
        assert self.gateway is not None
        assert self.gateway.stop() == 0, "the gateway did not stop cleanly on SIGTERM"
        self.gateway.start()


@pytest.fixture(params=["embedded", "gateway"])
def tier(request, tmp_path):
    card = tmp_path / "card.img"
    if request.param == "embedded":
        yield L2Tier("embedded", card)
        return
    with Gateway(tmp_path, card_size_gb=CARD_GB) as gw:
        yield L2Tier("gateway", card, gw)


def server_on(tier: L2Tier, workdir: Path, name: str) -> MPServer:
    return MPServer([tier.adapter()], workdir, l1_size_gb=1, name=name)


def test_store_clear_l1_restore_from_card(tier, tmp_path):
    with server_on(tier, tmp_path, "server") as server, VLLMClient(server.url, SHAPE) as client:
        stored = store_prompt(server, client, TOKENS)
        assert server.l1_object_count() == TOKENS // 256, "the stored prompt is not in L1"
        assert drop_l1(server) == 0, "L1 still holds objects after POST /cache/clear"

        assert_restored_from_card(server, restore_prompt(server, client, stored))
        # A prompt that was never stored misses: hits come from what was stored.
        assert client.lookup("never-stored", prompt(TOKENS, seed=7)) == 0
        client.end_request("never-stored")
        # Restoring again (L1 holds nothing: the default prefetch policy does
        # not retain L2 loads in L1) reads the card again, with the same bytes.
        assert_restored_from_card(server, restore_prompt(server, client, stored))


def restore_after_restart(tier: L2Tier, tmp_path: Path, restart_gateway: bool) -> None:
    with server_on(tier, tmp_path, "first") as first, VLLMClient(first.url, SHAPE) as client:
        stored = store_prompt(first, client, TOKENS)
    assert first.proc.poll() is not None, "the first server is still running"
    if restart_gateway:
        tier.restart_gateway()
    with server_on(tier, tmp_path, "second") as second, VLLMClient(second.url, SHAPE) as client:
        assert second.l1_object_count() == 0, "a new server starts with an empty L1"
        assert_restored_from_card(second, restore_prompt(second, client, stored))


def test_prompt_comes_back_after_server_restart(tier, tmp_path):
    restore_after_restart(tier, tmp_path, restart_gateway=False)


def test_prompt_comes_back_after_gateway_and_server_restart(tmp_path):
    with Gateway(tmp_path, card_size_gb=CARD_GB) as gw:
        restore_after_restart(L2Tier("gateway", tmp_path / "card.img", gw), tmp_path, restart_gateway=True)


def test_fresh_card_does_not_hit(tmp_path):
    """Control for the restart test: the same prompt on a new server over a
    different, empty card misses, so a hit after a restart comes from the card."""
    tier = L2Tier("embedded", tmp_path / "card.img")
    with server_on(tier, tmp_path, "first") as first, VLLMClient(first.url, SHAPE) as client:
        stored = store_prompt(first, client, TOKENS)
    other = L2Tier("embedded", tmp_path / "other" / "card.img")
    with server_on(other, tmp_path, "other") as server, VLLMClient(server.url, SHAPE) as client:
        assert client.lookup("on-empty-card", stored.tokens) == 0
        client.end_request("on-empty-card")


@pytest.mark.parametrize("l1_in_shm", [True, False], ids=["shm-l1", "process-l1"])
def test_gateway_moves_bytes_in_place_when_l1_is_in_shm(tmp_path, l1_in_shm):
    """The README's gateway deployment: `lmcache server --shm-name` puts LMCache's L1 in a /dev/shm file,
    and the gateway (on a memory-speed card) stores every chunk from it and loads every chunk into it in
    place (protocol r3 segments: no ring copy, issue 10 item 2's one-copy path). Without --shm-name the same
    prompt round-trips with no segment use, so the counters tell the two paths apart."""
    name = f"adp-e2e-{os.getpid()}-{int(l1_in_shm)}"
    pool = Path(f"/dev/shm/lmcache_l1_pool_{name}")
    extra = ["--shm-name", name] if l1_in_shm else []
    chunks = TOKENS // 256
    try:
        with temp_gateway(memory=True, card_size_gb=CARD_GB) as gw:
            server = MPServer([adp_adapter(gateway=gw.url)], tmp_path, l1_size_gb=1, extra_args=extra, name="shm")
            with server, VLLMClient(server.url, SHAPE) as client:
                assert pool.exists() == l1_in_shm, f"LMCache's L1 pool file {pool} exists: {pool.exists()}"
                stored = store_prompt(server, client, TOKENS)
                assert drop_l1(server) == 0, "L1 still holds objects after POST /cache/clear"
                assert_restored_from_card(server, restore_prompt(server, client, stored))
                stats = read_gateway_stats(gw.unix_url)
            want = chunks if l1_in_shm else 0
            assert (stats["segment_stores"], stats["segment_loads"]) == (want, want), stats
            assert (stats["segments"] > 0) == l1_in_shm, stats  # one mapping per connection of the connector
    finally:
        pool.unlink(missing_ok=True)  # LMCache leaves its pool file behind when it stops
