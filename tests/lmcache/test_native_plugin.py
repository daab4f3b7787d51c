# SPDX-License-Identifier: Apache-2.0
"""The real LMCache path: LMCache's native_plugin factory builds its
NativeConnectorL2Adapter over ADPConnector, and the tests drive that adapter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("lmcache")

from tests.helpers import L2, MIB, corrupt, payload  # noqa: E402

CHUNK = 256 * 1024


def data_for(key) -> bytes:
    return payload(repr(key), CHUNK)


@pytest.fixture
def l2(card):
    a = L2(card=card, card_size_gb=0.125)
    yield a
    a.close()


def test_factory_builds_native_adapter(l2):
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import NativeConnectorL2Adapter

    from lmcache_adp import ADPConnector

    assert isinstance(l2.adapter, NativeConnectorL2Adapter)
    assert isinstance(l2.native, ADPConnector)
    assert l2.adapter.report_status()["is_healthy"]


def test_store_lookup_load_bytes_equal(l2):
    keys = [L2.key(i) for i in range(8)]
    assert l2.store(keys, [data_for(k) for k in keys])
    assert l2.lookup(keys) == [True] * 8
    hits, got = l2.load(keys, [CHUNK] * 8)
    assert hits == [True] * 8
    assert got == [data_for(k) for k in keys]


def test_per_key_miss_semantics(l2):
    stored = [L2.key(i) for i in (1, 3)]
    l2.store(stored, [data_for(k) for k in stored])
    keys = [L2.key(i) for i in range(5)]
    assert l2.lookup(keys) == [False, True, False, True, False]
    hits, got = l2.load(keys, [CHUNK] * 5)
    assert hits == [False, True, False, True, False]
    assert got[0] == b"\xee" * CHUNK and got[2] == b"\xee" * CHUNK  # missed buffers untouched
    assert got[1] == data_for(keys[1]) and got[3] == data_for(keys[3])


def test_model_names_with_slash_and_salts_are_separate(l2):
    a = L2.key(7, model="org/model-a", salt="tenantA")
    b = L2.key(7, model="org/model-a", salt="tenantB")
    plain = L2.key(7, model="org/model-a")
    l2.store([a], [data_for(a)])
    assert l2.lookup([a, b, plain]) == [True, False, False]
    hits, _ = l2.load([b], [CHUNK])
    assert hits == [False]


def test_delete(l2):
    keys = [L2.key(i) for i in range(4)]
    l2.store(keys, [data_for(k) for k in keys])
    l2.delete(keys[:2])
    assert l2.lookup(keys) == [False, False, True, True]


def test_eviction_when_full(card):
    l2 = L2(card=card, card_size_gb=1 / 32)  # 32 MiB card, 1 MiB regions
    try:
        keys = [L2.key(i) for i in range(400)]  # 100 MiB of chunks
        for i in range(0, 400, 8):
            assert l2.store(keys[i : i + 8], [data_for(k) for k in keys[i : i + 8]])
        st = l2.native.stats()
        assert st["used_bytes"] <= st["capacity_bytes"] and st["evicted_objects"] > 0
        assert os.path.getsize(card) == 32 * MIB
        found = l2.lookup(keys)
        assert not found[0] and found[-1]
        assert sum(found) == st["objects"]
        hits, got = l2.load(keys[-8:], [CHUNK] * 8)
        assert hits == [True] * 8 and got == [data_for(k) for k in keys[-8:]]
    finally:
        l2.close()


def test_restart_recovery(card):
    keys = [L2.key(i, salt="s1") for i in range(20)]
    a = L2(card=card, card_size_gb=0.125)
    a.store(keys, [data_for(k) for k in keys])
    a.delete(keys[:5])
    used = a.native.stats()["used_bytes"]
    a.close()

    b = L2(card=card)
    try:
        assert b.native.stats()["used_bytes"] == used
        assert b.lookup(keys) == [False] * 5 + [True] * 15
        hits, got = b.load(keys[5:], [CHUNK] * 15)
        assert hits == [True] * 15 and got == [data_for(k) for k in keys[5:]]
    finally:
        b.close()


def test_corrupted_byte_is_a_miss(card):
    a = L2(card=card, card_size_gb=0.125)
    try:
        k = L2.key(42)
        a.store([k], [data_for(k)])
        from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string

        corrupt(card, _object_key_to_string(k), 4096 + 777)
        hits, got = a.load([k], [CHUNK])
        # A miss; the check runs while the bytes are copied, so the buffer may
        # hold the damaged bytes: LMCache deletes the buffers of missed keys.
        assert hits == [False] and got[0] != data_for(k)
        assert a.native.stats()["checksum_failures"] == 1
        assert a.lookup([k]) == [False]
    finally:
        a.close()


def test_close_with_work_pending(card):
    a = L2(card=card, card_size_gb=0.5, num_workers=1)
    keys = [L2.key(i) for i in range(64)]
    objs = L2.objects([bytes(2 * MIB)] * 64)
    tids = [a.adapter.submit_store_task(keys[i : i + 8], objs[i : i + 8]) for i in range(0, 64, 8)]
    native = a.native
    a.close()  # stops LMCache's demux thread, then closes the connector
    waiting = set(a.adapter._pending_ops)  # futures LMCache had not seen complete
    done = {c[0]: c for c in native.drain_completions()}
    assert len(tids) == 8
    assert waiting <= set(done), "a future was left hanging"
    assert all(done[f][1] or done[f][2] == "connector closed" for f in waiting)
    # One worker, 128 MiB queued: close() came while stores were still queued,
    # and those failed as closed (a close that finished the work would pass the
    # checks above with nothing to check).
    closed = [f for f in waiting if not done[f][1]]
    assert closed, f"no store was pending at close(): {len(waiting)} futures unseen, all succeeded"


KILLED = textwrap.dedent(
    """
    import sys
    from tests.helpers import L2, payload
    l2 = L2(card=sys.argv[1], card_size_gb=0.25)
    i = 0
    while True:
        keys = [L2.key(i * 4 + j) for j in range(4)]
        assert l2.store(keys, [payload(repr(k), 1 << 20) for k in keys])
        print(i, flush=True)
        i += 1
    """
)


def test_killed_while_storing(card):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    err_path = os.path.join(os.path.dirname(os.path.dirname(card)), "child.err")
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED, card], stdout=subprocess.PIPE, stderr=err, text=True, cwd=root
        )
    acked = 0
    for line in proc.stdout:
        acked = int(line) + 1
        if acked == 30:
            break
    proc.kill()
    proc.wait()
    # Otherwise the checks below run over nothing: the child must have been
    # storing (30 acknowledged batches) when it was killed.
    assert acked == 30, f"the child acknowledged {acked} batches, then stopped:\n{open(err_path).read()[-3000:]}"
    b = L2(card=card)
    try:
        keys = [L2.key(i) for i in range(acked * 4 + 8)]  # acknowledged, plus the batches cut off
        found = b.lookup(keys)
        assert all(found[: acked * 4][-64:])  # the youngest acknowledged ones, well within capacity
        hits, got = b.load(keys, [1 << 20] * len(keys))
        for k, h, g in zip(keys, hits, got, strict=True):
            if h:
                assert g == payload(repr(k), 1 << 20)
        assert b.native.stats()["checksum_failures"] == 0
    finally:
        b.close()
