# SPDX-License-Identifier: Apache-2.0
"""The card store through its direct binding: format, integrity, capacity, recovery."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from lmcache_adp import CardStore, format_card
from tests.helpers import MIB, corrupt, payload


def open_store(path, size=64 * MIB, **kw):
    return CardStore(path, size, **kw)


def test_new_card_is_sparse_and_formatted(card):
    s = open_store(card, 64 * MIB)
    st = s.stats()
    assert os.path.getsize(card) == 64 * MIB
    assert os.stat(card).st_blocks * 512 < 8 * MIB  # sparse: only metadata written
    assert st["objects"] == 0 and st["used_bytes"] == 0
    assert st["capacity_bytes"] <= 64 * MIB
    assert st["num_regions"] >= 8


def test_put_get_roundtrip_various_sizes(card):
    s = open_store(card)
    sizes = [1, 100, 4095, 4096, 4097, 65536, 300_001]
    for n in sizes:
        s.put(f"k{n}", payload(f"k{n}", n))
    for n in sizes:
        assert s.get(f"k{n}") == payload(f"k{n}", n)
        assert s.exists(f"k{n}")
    assert s.get("absent") is None and not s.exists("absent")
    st = s.stats()
    assert st["objects"] == len(sizes) and st["hits"] == len(sizes) and st["misses"] == 1


def test_overwrite_serves_newest(card):
    s = open_store(card)
    s.put("k", b"old" * 1000)
    s.put("k", b"new" * 500)
    assert s.get("k") == b"new" * 500
    s.close()
    s = open_store(card)
    assert s.get("k") == b"new" * 500
    assert s.stats()["objects"] == 1


def test_keys_are_opaque(card):
    s = open_store(card)
    keys = ["meta-llama/Llama-3.1-8B@00000000@0@ab", "../../etc/passwd", "a\\b", "ünïcode/ключ", "x" * 1024]
    for k in keys:
        s.put(k, payload(k, 5000))
    for k in keys:
        assert s.get(k) == payload(k, 5000)
    assert os.listdir(os.path.dirname(card)) == ["card.img"]  # no file was made from a key


def test_key_bounds(card):
    s = open_store(card)
    with pytest.raises(ValueError, match="exceeds the bound of 1024 bytes"):
        s.put("x" * 1025, b"data")
    with pytest.raises(ValueError, match="empty key"):
        s.put("", b"data")
    assert not s.exists("x" * 1025)


def test_object_larger_than_card_fails_clearly(card, capfd):
    s = open_store(card, 32 * MIB)
    with pytest.raises(RuntimeError, match="larger than the largest object"):
        s.put("huge", bytes(40 * MIB))
    with pytest.raises(RuntimeError, match="larger than the largest object"):
        s.put("huge2", bytes(40 * MIB))
    assert s.stats()["store_failures"] == 2 and not s.exists("huge")
    assert capfd.readouterr().err.count("refuses objects larger than") == 1  # logged once, not per store


def test_restart_recovers_everything(card):
    s = open_store(card)
    keys = [f"model/x@{i:08x}@0@{i:x}" for i in range(60)]
    for i, k in enumerate(keys):
        s.put(k, payload(k, 1000 + 997 * i))
    s.remove(keys[3])
    before = s.stats()
    s.close()
    s = open_store(card)
    after = s.stats()
    assert after["objects"] == before["objects"] == 59
    assert after["used_bytes"] == before["used_bytes"]
    assert after["recovered_objects"] == 59
    for i, k in enumerate(keys):
        expect = None if i == 3 else payload(k, 1000 + 997 * i)
        assert s.get(k) == expect


def test_deleted_key_stays_deleted_after_restarts(card):
    s = open_store(card)
    s.put("a", b"1" * 10000)
    s.put("b", b"2" * 10000)
    assert s.remove("a") and not s.remove("a")
    s.close()
    for _ in range(2):
        s = open_store(card)
        assert s.get("a") is None and s.get("b") == b"2" * 10000
        s.close()


def test_flipped_payload_byte_is_a_counted_miss(card):
    s = open_store(card)
    data = payload("victim", 20000)
    s.put("victim", data)
    s.put("bystander", payload("bystander", 20000))
    image = open(card, "rb").read()
    hdr = image.find(b"victim")
    assert hdr > 0
    block = hdr - hdr % 4096
    with open(card, "r+b") as f:  # flip one payload byte behind the store's back
        f.seek(block + 4096 + 12345)
        b = f.read(1)
        f.seek(block + 4096 + 12345)
        f.write(bytes([b[0] ^ 0x40]))
        f.flush()
        os.fsync(f.fileno())
    assert s.get("victim") is None
    st = s.stats()
    assert st["checksum_failures"] == 1 and st["objects"] == 1
    assert s.get("bystander") == payload("bystander", 20000)
    s.close()
    s = open_store(card)  # the bad object was dropped on the card too
    assert s.get("victim") is None and s.stats()["objects"] == 1


def test_flipped_header_byte_drops_object_on_restart(card):
    s = open_store(card)
    s.put("bystander", payload("bystander", 8000))  # before the victim: recovery walks up to the bad header
    s.put("victim", payload("victim", 8000))
    s.close()
    with open(card, "r+b") as f:
        image = f.read()
        pos = image.find(b"victim")
        f.seek(pos)
        f.write(b"V")
    s = open_store(card)
    assert s.get("victim") is None and s.get("Victim") is None
    assert s.get("bystander") == payload("bystander", 8000), "recovery dropped a sound object"
    assert s.stats()["objects"] == 1
    # A header of this card and epoch that fails its checksum is damage, no crash's cut: counted (the record
    # itself is what it cost).
    st = s.stats()
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 1), st


def test_eviction_keeps_card_within_capacity(card):
    s = open_store(card, 32 * MIB)
    cap = s.stats()["capacity_bytes"]
    n = 400  # ~100 MiB through a 32 MiB card
    for i in range(n):
        s.put(f"k{i}", payload(f"k{i}", 256 * 1024))
        if i % 10 == 0:
            assert s.get("k0") is not None or i < 100  # keep k0's region recently used
    st = s.stats()
    assert st["used_bytes"] <= cap
    assert st["evicted_objects"] > 0 and st["evicted_regions"] > 0
    assert os.path.getsize(card) == 32 * MIB
    assert s.get(f"k{n - 1}") == payload(f"k{n - 1}", 256 * 1024)  # newest present
    assert s.get("k0") == payload("k0", 256 * 1024)  # recently used survives (LRU)
    assert s.get("k10") is None  # old and untouched: evicted
    assert st["objects"] == sum(s.exists(f"k{i}") for i in range(n))


def test_second_open_of_same_card_is_refused(card):
    s = open_store(card)
    with pytest.raises(RuntimeError, match="already open"):
        open_store(card)
    s.close()
    open_store(card).close()  # free again once closed


def test_refuses_foreign_data(tmp_path):
    path = tmp_path / "notacard.img"
    path.write_bytes(b"precious filesystem" + bytes(64 * MIB))
    with pytest.raises(ValueError, match="not an ADP card"):
        CardStore(str(path))
    assert path.read_bytes().startswith(b"precious filesystem")


def test_missing_card_without_size(tmp_path):
    with pytest.raises(RuntimeError, match="does not exist"):
        CardStore(str(tmp_path / "nope.img"))


def test_format_wipes(card):
    s = open_store(card)
    s.put("k", b"x" * 100)
    s.close()
    format_card(card)
    s = open_store(card)
    assert s.get("k") is None and s.stats()["objects"] == 0


WRITER = textwrap.dedent(
    """
    import sys
    from lmcache_adp import CardStore
    from tests.helpers import payload
    s = CardStore(sys.argv[1], 256 << 20)
    i = 0
    while True:
        k = f"key{i}"
        s.put(k, payload(k, 1 << 20))
        print(k, flush=True)   # acknowledged
        i += 1
    """
)


def test_killed_while_storing_loses_nothing_acknowledged(card):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, card],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    acked = []
    for line in proc.stdout:
        acked.append(line.strip())
        if len(acked) == 150:  # past one lap of the card: evictions happen too
            break
    proc.kill()
    proc.wait()
    s = open_store(card)
    st = s.stats()
    # Everything acknowledged and not evicted since is back, byte for byte.
    evicted_before_kill = [k for k in acked if not s.exists(k)]
    assert len(evicted_before_kill) < len(acked) / 2
    for k in acked:
        got = s.get(k)
        assert got is None or got == payload(k, 1 << 20)
    newest = acked[-40:]  # far younger than one lap of 256 MiB
    assert all(s.get(k) == payload(k, 1 << 20) for k in newest)
    # Anything beyond the last ack was either complete or never visible.
    nxt = f"key{len(acked)}"
    assert s.get(nxt) in (None, payload(nxt, 1 << 20))
    assert st["checksum_failures"] == 0


def test_eviction_order_after_restart_follows_write_order(card):
    s = open_store(card, 32 * MIB)
    for i in range(40):
        s.put(f"old{i}", payload(f"old{i}", 256 * 1024))
    for i in range(40):
        s.put(f"new{i}", payload(f"new{i}", 256 * 1024))
    s.close()
    s = open_store(card, 32 * MIB)
    for i in range(60):  # the card holds 120 such objects (4 a region): 20 must go
        s.put(f"more{i}", payload(f"more{i}", 256 * 1024))
    st = s.stats()
    assert st["evicted_objects"] > 0
    old_left = sum(s.exists(f"old{i}") for i in range(40))
    new_left = sum(s.exists(f"new{i}") for i in range(40))
    assert new_left == 40 and old_left < 40


def test_recovery_is_reported(card):
    s = open_store(card)
    for i in range(25):
        s.put(f"k{i}", b"x" * 3000)
    s.close()
    out = subprocess.run(
        [sys.executable, "-c", f"from lmcache_adp import CardStore; CardStore({card!r})"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "recovered 25 objects" in out.stderr and " s\n" in out.stderr


def test_verify_finds_and_repairs_damage(card):
    s = open_store(card)
    for i in range(30):
        s.put(f"obj{i:02d}", payload(f"obj{i:02d}", 9000))
    corrupt(card, "obj07", 4096 + 100)  # a payload byte
    seen = []
    r = s.verify(repair=False, progress=lambda d, t: seen.append((d, t)))
    assert (r["checked"], r["bad"], r["repaired"]) == (30, 1, 0)
    assert "payload checksum mismatch" in r["bad_objects"][0]
    assert seen[-1] == (30, 30)
    assert s.stats()["objects"] == 30  # a report only
    r = s.verify(repair=True)
    assert (r["bad"], r["repaired"]) == (1, 1)
    assert s.verify()["bad"] == 0 and s.stats()["objects"] == 29
    s.close()
    s = open_store(card)
    assert s.get("obj07") is None and s.stats()["objects"] == 29


def test_a_full_card_logs_that_it_evicts_once(card):
    """README, Operations, Logs: "one line per state change: card created, formatted, recovered (...), full and
    evicting, ... Never one line per request at the default level". A card filled 3 times over logs
    `card X is full: evicting least recently used regions` (INFO) once, not once per eviction (review34: no test
    looked for the line)."""
    script = (
        "from lmcache_adp import CardStore\n"
        f"s = CardStore({card!r}, {16 * MIB})\n"
        "for i in range(150): s.put(f'k{i}', b'x' * (300 << 10))\n"
        "st = s.stats()\n"
        "print(st['evicted_objects'], st['evicted_regions'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "ADP_LOG_LEVEL": "INFO"},
    )
    evicted_objects, evicted_regions = map(int, out.stdout.split())
    assert evicted_objects > 0 and evicted_regions > 1, out.stdout
    lines = [ln for ln in out.stderr.splitlines() if f"card {card} is full: evicting" in ln]
    assert len(lines) == 1, out.stderr[-3000:]
