# SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the test tree (which mirrors src_cpp/ and lmcache_adp/)."""

from __future__ import annotations

import pytest


@pytest.fixture
def card(tmp_path):
    """Path of a card image that does not exist yet (created on first open)."""
    return str(tmp_path / "cards" / "card.img")
