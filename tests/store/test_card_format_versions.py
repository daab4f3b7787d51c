# SPDX-License-Identifier: Apache-2.0
"""Format version 4: an older card (1 or 2) is refused with what to run, and the path works; a version-3 card is
opened and read as that version wrote it (its tombstones keep no key). A superblock (valid CRC) whose region size
format would not make is refused."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from lmcache_adp import CardStore
from lmcache_adp._native import FORMAT_VERSION, crc32c
from tests.helpers import MIB, payload


def rewrite_superblock_field(path: str, at: int, fmt: str, value: int) -> None:
    """Sets the superblock field at byte `at` (struct format `fmt`) of a card to `value`, its CRC kept valid."""
    with open(path, "r+b") as f:
        sb = bytearray(f.read(72))
        struct.pack_into(fmt, sb, at, value)
        struct.pack_into("<I", sb, 68, crc32c(bytes(sb[:68])))
        f.seek(0)
        f.write(sb)


def rewrite_superblock_version(path: str, version: int) -> None:
    """Turns a card's superblock into one of format `version` (valid CRC)."""
    rewrite_superblock_field(path, 8, "<I", version)


def test_format_version_is_4():
    assert FORMAT_VERSION == 4


@pytest.mark.parametrize("old", [1, 2])
def test_older_card_is_refused_with_what_to_run_then_reformatted(card, old):
    s = CardStore(card, 64 * MIB)
    s.put("k", payload("k", 10000))
    s.close()
    rewrite_superblock_version(card, old)
    with pytest.raises(ValueError) as e:
        CardStore(card)
    msg = str(e.value)
    assert f"format version {old}" in msg and "reads versions 3 to 4" in msg
    assert f"lmcache-adp format --card {card} --yes" in msg and "lost" in msg
    # The CLI says the same and exits non-zero, touching nothing.
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "status", "--card", card], capture_output=True, text=True
    )
    assert r.returncode != 0 and f"format version {old}" in r.stderr
    # The path the message gives: reformat, then the card works (empty).
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "format", "--card", card, "--yes"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    s = CardStore(card)
    assert s.stats()["objects"] == 0 and s.get("k") is None
    s.put("k", b"again")
    assert s.get("k") == b"again"
    s.close()


def revive_first_object(card: str, key: bytes, data: bytes) -> None:
    """Undoes the tombstone of the first object of the first region (as if it had been lost in a power cut): its
    header is made live again, for `key` holding `data`."""
    with open(card, "r+b") as f:
        region0 = 1 * MIB
        f.seek(region0 + 4096)
        hdr = bytearray(f.read(4096))
        assert hdr[:8] == b"ADPOBJT1"
        flags = struct.unpack_from("<I", hdr, 48)[0]
        assert flags & 1  # deleted (superseded)
        # A tombstone of a format-3 build keeps no key: rebuild the live header from the key.
        struct.pack_into("<I", hdr, 48, 0)  # flags
        struct.pack_into("<I", hdr, 52, len(key))  # key_bytes
        struct.pack_into("<I", hdr, 56, crc32c(data))
        hdr[64 : 64 + len(key)] = key
        struct.pack_into("<I", hdr, 60, crc32c(key, crc32c(bytes(hdr[:60]))))
        f.seek(region0 + 4096)
        f.write(hdr)


def test_deleted_key_stays_deleted_when_an_older_copy_survives(card):
    """Recovery orders a delete against an older live copy by sequence number.

    The older copy's own tombstone is undone by hand (as if it had been lost
    in a power cut); the delete of the newer copy must still win."""
    s = CardStore(card, 64 * MIB)
    s.put("k", payload("old", 8192))  # seq 1, region A, first object
    st = s.stats()
    s.put("k", payload("new", 8192))  # seq 2: marks the old copy deleted
    assert s.remove("k")  # tombstone over the new copy, seq 2
    s.close()
    assert st["objects"] == 1
    revive_first_object(card, b"k", payload("old", 8192))
    s = CardStore(card)
    assert s.get("k") is None and not s.exists("k")
    assert s.stats()["objects"] == 0
    s.close()


def test_a_read_only_open_leaves_an_older_copy_unmarked(card, capfd):
    """Recovery marks a surviving older copy deleted (a tombstone write); a read-only open (status, verify) writes
    nothing: it says so, and loads the newer copy. The next read-write open marks it."""
    s = CardStore(card, 64 * MIB)
    s.put("k", payload("old", 8192))
    s.put("k", payload("new", 8192))
    s.close()
    revive_first_object(card, b"k", payload("old", 8192))
    before = open(card, "rb").read()
    capfd.readouterr()
    s = CardStore(card, read_only=True)
    assert s.get("k") == payload("new", 8192) and s.stats()["objects"] == 1
    s.close()
    assert f"card {card} is open read-only: 1 older copies are left as they are" in capfd.readouterr().err
    assert open(card, "rb").read() == before
    s = CardStore(card)
    assert s.get("k") == payload("new", 8192)
    s.close()
    assert open(card, "rb").read() != before  # the older copy's tombstone, written now


def strip_tombstone_keys(card: str) -> int:
    """Makes every tombstone on the card one a format-3 build wrote: no key (key_bytes 0, the key's bytes zeroed),
    its hash_key kept. Returns how many it changed."""
    n = 0
    with open(card, "r+b") as f:
        image = bytearray(f.read())
        for at in range(0, len(image), 4096):
            hdr = image[at : at + 4096]
            flags, key_bytes = struct.unpack_from("<II", hdr, 48)
            if hdr[:8] != b"ADPOBJT1" or not flags & 1 or flags & 4 or not key_bytes:
                continue
            hdr[64 : 64 + key_bytes] = bytes(key_bytes)
            struct.pack_into("<I", hdr, 52, 0)
            struct.pack_into("<I", hdr, 60, crc32c(bytes(hdr[:60])))
            image[at : at + 4096] = hdr
            n += 1
        f.seek(0)
        f.write(image)
    return n


def test_a_version_3_card_opens_and_its_keyless_tombstones_still_order_deletes(card):
    """A version-3 card (its tombstones name only the key's hash_key) opens: its objects load, and a delete there
    still outranks an older live copy of that hash at recovery (as that version meant it). The superblock stays
    at 3; tombstones written on it from now on name their key, which a version-3 build reads as before."""
    s = CardStore(card, 64 * MIB)
    s.put("k", payload("old", 8192))  # seq 1, region A, first object
    s.put("k", payload("new", 8192))  # seq 2: marks the old copy deleted
    assert s.remove("k")  # tombstone over the new copy, seq 2
    s.put("kept", payload("kept", 20000))
    s.close()
    assert strip_tombstone_keys(card) == 2
    rewrite_superblock_version(card, 3)
    revive_first_object(card, b"k", payload("old", 8192))
    s = CardStore(card)
    assert s.get("k") is None and not s.exists("k"), "a version-3 tombstone no longer ordered the delete"
    assert s.get("kept") == payload("kept", 20000)
    assert s.stats()["objects"] == 1
    s.put("later", payload("later", 3000))
    assert s.remove("kept")
    s.close()
    with open(card, "rb") as f:
        assert struct.unpack_from("<I", f.read(12), 8)[0] == 3
    s = CardStore(card)
    assert s.get("later") == payload("later", 3000) and s.get("kept") is None
    s.close()


def test_a_superblock_whose_region_size_is_not_4k_blocks_is_refused_naming_it(card):
    """Format makes the region size 4 KiB blocks; a superblock with a valid CRC that says otherwise would open with
    every region unreadable (its reads misaligned): it is refused, the value named."""
    s = CardStore(card, 64 * MIB, region_bytes=2 * MIB)  # 31 regions: 31 x (2 MiB + 512) still fits the image
    s.put("k", payload("k", 10000))
    s.close()
    rewrite_superblock_field(card, 24, "<Q", 2 * MIB + 512)  # region_bytes
    with pytest.raises(RuntimeError) as e:
        CardStore(card)
    assert f"gives a region size of {2 * MIB + 512} bytes, not a multiple of 4096" in str(e.value)
    assert f"lmcache-adp format --card {card} --yes" in str(e.value)
