# SPDX-License-Identifier: Apache-2.0
"""The index holds a region number in 20 bits (src_cpp/store/key_index.h): a card that would have more than 1,048,575 regions is refused at
format, with the bound and what to do, and one at the bound formats."""

from __future__ import annotations

import pytest

from lmcache_adp import format_card
from tests.helpers import MIB

BOUND = (1 << 20) - 1


def sparse_image(path, regions: int) -> str:
    """A sparse image of the superblock area and `regions` regions of 1 MiB."""
    with open(path, "wb") as f:
        f.truncate(MIB + regions * MIB)
    return str(path)


def test_a_card_of_more_regions_than_the_index_holds_is_refused(tmp_path):
    image = sparse_image(tmp_path / "big.img", BOUND + 1)
    with pytest.raises(ValueError, match=f"{BOUND + 1} regions; this build indexes {BOUND} at most: format it with"):
        format_card(image, 0, MIB)
    with open(image, "rb") as f:
        assert f.read(4096) == bytes(4096), "the refused card was not written"
    format_card(sparse_image(tmp_path / "at-bound.img", BOUND), 0, MIB)
