# SPDX-License-Identifier: Apache-2.0
import os

import pytest

from lmcache_adp import _native

google_crc32c = pytest.importorskip("google_crc32c")


def test_known_vector():
    assert _native.crc32c(b"123456789") == 0xE3069283
    assert _native.crc32c(b"") == 0


@pytest.mark.parametrize("size", [1, 7, 8, 9, 4095, 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 1, 5 * 12288 + 77, 1 << 20])
@pytest.mark.parametrize("misalign", [0, 1, 5])
def test_matches_reference_library(size, misalign):
    data = os.urandom(size + misalign)[misalign:]
    assert _native.crc32c(data) == google_crc32c.value(data)


def test_extend_equals_whole():
    data = os.urandom(100_000)
    part = _native.crc32c(data[:33_333])
    assert _native.crc32c(data[33_333:], part) == _native.crc32c(data)


def test_uses_hardware_here():
    assert _native.crc32c_implementation() in ("sse4.2", "armv8")


@pytest.mark.parametrize("size", [1, 5, 4096, 3 * 4096 + 9, 1000_000])
def test_store_reads_check_while_copying(card, size):
    """get() copies through crc32c_copy: bytes and checksum both right at every length."""
    from lmcache_adp import CardStore

    s = CardStore(card, 64 << 20)
    data = os.urandom(size)
    s.put("k", data)
    assert s.get("k") == data
