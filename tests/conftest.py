# SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the test tree (which mirrors src_cpp/ and lmcache_adp/), and the check that the
native module under test was built from this tree's sources (tests/support/native_build.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.support.native_build import ALLOW, allowed, check_native

TREE = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session):
    """Stops the session before any test when lmcache_adp._native was built from other C++ sources than
    this tree's (or does not import): the message names the module and the rebuild command."""
    problem = check_native(TREE)
    if problem is None:
        return
    if allowed():
        warnings.warn(f"{problem}\n{ALLOW}=1: testing it anyway", stacklevel=1)
        return
    raise pytest.UsageError(problem)


@pytest.fixture
def card(tmp_path):
    """Path of a card image that does not exist yet (created on first open)."""
    return str(tmp_path / "cards" / "card.img")
