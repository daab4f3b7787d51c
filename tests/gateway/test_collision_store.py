# SPDX-License-Identifier: Apache-2.0
"""A store of a key forged to share another key's 64-bit hash_key (colliding_keys) leaves the other key's object
alone, through an embedded ADPConnector (both keys also survive a reopen of the card) and through the gateway
(another tenant's connector forging): each key loads its own bytes, both are counted, and a delete of the forged
key leaves the victim. Until session 21 the card's index was keyed by hash_key and the forged store took the
victim's entry, marking its object deleted: a client storing through a shared gateway could evict another tenant's
object whose key it could predict (the store level: tests/cpp/collision_store_test.cc)."""

from __future__ import annotations

from collections.abc import Callable

from lmcache_adp import ADPConnector
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway.test_collision_delete import tenant_and_forger
from tests.gateway.test_process_memory import colliding_keys
from tests.helpers import RawConnector, payload

SIZE = 64 * 1024


def loads(conn: RawConnector, key: str, size: int = SIZE) -> bytes | None:
    out = bytearray(size)
    return bytes(out) if conn.get([key], [memoryview(out)])[2] == [True] else None


def forged_store_spares_the_victim(victim_conn: RawConnector, forger: RawConnector, objects: Callable[[], int]):
    victim, forged = colliding_keys()
    before = objects()
    assert victim_conn.set([victim], [memoryview(payload(victim, SIZE))])[0]
    assert forger.set([forged], [memoryview(payload(forged, SIZE // 2))])[0]
    assert loads(victim_conn, victim) == payload(victim, SIZE), "the forged key's store evicted the victim"
    assert loads(forger, forged, SIZE // 2) == payload(forged, SIZE // 2)
    assert objects() == before + 2
    ok, err, per_key = forger.delete([forged])
    assert ok and per_key == [True], err
    assert loads(victim_conn, victim) == payload(victim, SIZE), "the forged key's delete deleted the victim"
    assert forger.exists([forged])[2] == [False]
    assert objects() == before + 1


def test_a_forged_store_spares_the_victim_embedded(card):
    conn = ADPConnector(card=card, card_size_gb=0.0625, num_workers=1)
    victim, forged = colliding_keys()
    try:
        c = RawConnector(conn)
        forged_store_spares_the_victim(c, c, lambda: conn.stats()["objects"])
        assert c.set([forged], [memoryview(payload(forged, SIZE))])[0]  # both on the card for the reopen
    finally:
        conn.close()
    conn = ADPConnector(card=card, num_workers=1)
    try:
        c = RawConnector(conn)
        assert loads(c, victim) == payload(victim, SIZE), "after a reopen"
        assert loads(c, forged) == payload(forged, SIZE), "after a reopen"
        assert conn.stats()["objects"] == 2
    finally:
        conn.close()


def test_a_forged_store_spares_the_victim_through_the_gateway(gateway):
    with tenant_and_forger(gateway) as (tenant, forger):
        forged_store_spares_the_victim(tenant, forger, lambda: read_gateway_stats(gateway.unix_url)["objects"])
