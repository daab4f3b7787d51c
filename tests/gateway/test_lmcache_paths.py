# SPDX-License-Identifier: Apache-2.0
"""Unix (ring) and TCP (inline) gateways under LMCache's own NativeConnectorL2Adapter,
built by its native_plugin factory, with byte checks; and two client processes
sharing one gateway."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from tests.helpers import L2, payload

pytestmark = pytest.mark.lmcache

SIZES = [256 * 1024, 2 * 1024 * 1024, 4096 + 17, 1]


def params(gw, transport: str) -> dict:
    if transport == "unix":
        return {"gateway": gw.unix_url, "ring_mb": 8, "timeout_ms": 10000}
    return {"gateway": gw.tcp_url, "token_file": gw.token_file, "timeout_ms": 10000}


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_store_lookup_load_delete(gateway, transport):
    l2 = L2(**params(gateway, transport))
    keys = [L2.key(i) for i in range(len(SIZES))]
    datas = [payload(f"{transport}{i}", s) for i, s in enumerate(SIZES)]
    assert l2.store(keys, datas)
    missing = L2.key(999)
    assert l2.lookup(keys + [missing]) == [True] * len(keys) + [False]
    hits, got = l2.load(keys + [missing], SIZES + [64])
    assert hits == [True] * len(keys) + [False]
    assert got[: len(keys)] == datas
    assert got[-1] == b"\xee" * 64  # a missed key's buffer is left untouched
    l2.delete(keys[:2])
    assert l2.lookup(keys) == [False, False, True, True]
    l2.close()


def test_batch_larger_than_ring_goes_in_rounds(gateway):
    # 12 objects of 2 MiB through a 4 MiB ring: back-pressure, nothing dropped.
    l2 = L2(gateway=gateway.unix_url, ring_mb=4, num_workers=1)
    keys = [L2.key(100 + i) for i in range(12)]
    datas = [payload(f"round{i}", 2 * 1024 * 1024) for i in range(12)]
    assert l2.store(keys, datas)
    hits, got = l2.load(keys, [len(d) for d in datas])
    assert all(hits) and got == datas
    l2.close()


def test_object_larger_than_ring_fails_clearly(gateway):
    from lmcache_adp import ADPConnector
    from tests.helpers import RawConnector

    c = RawConnector(ADPConnector(gateway=gateway.unix_url, ring_mb=1, process_memory=False))
    ok, err, per_key = c.set(["big", "small"], [memoryview(bytes(2 << 20)), memoryview(b"x" * 10)])
    assert not ok and "larger than the ring (raise ring_mb)" in err
    assert per_key == [False, True]
    c.conn.close()
    # Read from the client's memory (r5), a store does not pass through the ring: no such bound.
    c = RawConnector(ADPConnector(gateway=gateway.unix_url, ring_mb=1))
    ok, err, per_key = c.set(["big", "small"], [memoryview(bytes(2 << 20)), memoryview(b"x" * 10)])
    assert ok and per_key == [True, True], err
    c.conn.close()


def _client(url: str, token_file: str, script: list, out: mp.Queue) -> None:
    """Runs [(op, key_id, salt), ...] through its own L2 adapter; reports results."""
    l2 = L2(gateway=url, token_file=token_file) if url.startswith("tcp") else L2(gateway=url)
    results = []
    for op, key_id, salt in script:
        key = L2.key(key_id, salt=salt)
        data = payload(f"{key_id}{salt}", 100_000 + key_id)
        if op == "store":
            results.append(l2.store([key], [data]))
        elif op == "lookup":
            results.append(l2.lookup([key])[0])
        elif op == "load":
            hits, got = l2.load([key], [len(data)])
            results.append(hits[0] and got[0] == data)
        elif op == "delete":
            l2.delete([key])
            results.append(True)
    l2.close()
    out.put(results)


def run_client(url, token_file, script):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_client, args=(url, token_file, script, q))
    p.start()
    res = q.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0
    return res


def test_two_client_processes_share_the_card(gateway):
    a, b = gateway.unix_url, gateway.tcp_url
    tok = gateway.token_file
    # A stores (one key plain, one per tenant); B, another process over TCP, sees them.
    assert run_client(a, tok, [("store", 1, ""), ("store", 2, "tenantA")]) == [True, True]
    assert run_client(
        b, tok, [("load", 1, ""), ("lookup", 2, "tenantA"), ("lookup", 2, "tenantB"), ("lookup", 2, "")]
    ) == [True, True, False, False]
    # B deletes; A no longer finds it.
    assert run_client(b, tok, [("delete", 1, "")]) == [True]
    assert run_client(a, tok, [("lookup", 1, ""), ("load", 2, "tenantA")]) == [False, True]
