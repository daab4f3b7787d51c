# SPDX-License-Identifier: Apache-2.0
"""A delete of a key forged to share another key's 64-bit hash (the card index's key: colliding_keys) leaves the
other key's object alone, through an embedded ADPConnector and through the gateway (another tenant's connector):
the forged key is reported gone (true, as any absent key), the victim still loads its bytes, `deletes` does not
move; the victim's own delete still deletes it. Until session 20 the card's remove() marked deleted whatever
object the index held under the hash, so the forged delete deleted the victim (brief defects2 item 1; the store
level: tests/cpp/collision_delete_test.cc)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from lmcache_adp import ADPConnector
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway.test_process_memory import colliding_keys
from tests.helpers import RawConnector, payload

SIZE = 64 * 1024


def forged_delete_spares_the_victim(victim_conn: RawConnector, forger: RawConnector, deletes: Callable[[], int]):
    victim, forged = colliding_keys()
    data = payload(victim, SIZE)
    assert victim_conn.set([victim], [memoryview(data)])[0]
    before = deletes()
    ok, err, per_key = forger.delete([forged])
    assert ok and per_key == [True], err  # not on the card: gone
    out = bytearray(SIZE)
    assert victim_conn.get([victim], [memoryview(out)])[2] == [True], "the forged key's delete deleted the victim"
    assert bytes(out) == data
    assert deletes() == before, "a delete of another key was counted"
    ok, err, per_key = victim_conn.delete([victim])
    assert ok and per_key == [True], err
    assert deletes() == before + 1
    assert victim_conn.exists([victim])[2] == [False]


def test_a_forged_delete_spares_the_victim_embedded(card):
    conn = ADPConnector(card=card, card_size_gb=0.0625, num_workers=1)
    try:
        c = RawConnector(conn)
        forged_delete_spares_the_victim(c, c, lambda: conn.stats()["deletes"])
    finally:
        conn.close()


@contextlib.contextmanager
def tenant_and_forger(gateway) -> Iterator[tuple[RawConnector, RawConnector]]:
    """Two tenants of one gateway: one over its unix socket, the forger over TCP with its token."""
    tenant = ADPConnector(gateway=gateway.unix_url, num_workers=1, timeout_ms=10000)
    forger = ADPConnector(gateway=gateway.tcp_url, token_file=gateway.token_file, num_workers=1, timeout_ms=10000)
    try:
        yield RawConnector(tenant), RawConnector(forger)
    finally:
        tenant.close()
        forger.close()


def test_a_forged_delete_spares_the_victim_through_the_gateway(gateway):
    with tenant_and_forger(gateway) as (tenant, forger):
        forged_delete_spares_the_victim(tenant, forger, lambda: read_gateway_stats(gateway.unix_url)["deletes"])
