# SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the test tree (which mirrors src_cpp/ and lmcache_adp/), and the check that the
native module under test was built from this tree's sources (tests/support/native_build.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest

from tests.support.native_build import ALLOW, allowed, check_native

TREE = Path(__file__).resolve().parents[1]

# Judged as pytest imports this conftest, which it does before any deeper one: tests/gateway/conftest.py
# imports lmcache_adp, whose __init__ reads _native's attributes (config.py), so on a stale module missing
# one, `pytest tests/gateway/test_x.py` died loading that conftest with an AttributeError traceback, before
# pytest_sessionstart (review r11 N12).
STALE = check_native(TREE)


# The ADP_* environment pytest started with: every gateway and server the tests start inherits it, so a module
# imported while collecting (a benchmark a test imports) may not change it (pytest_collection_finish).
def adp_environment() -> dict[str, str]:
    """The ADP_* variables of os.environ."""
    return {k: v for k, v in os.environ.items() if k.startswith("ADP_")}


ADP_ENV_AT_START = adp_environment()


def pytest_plugin_registered(plugin, manager):
    """Stops pytest as it registers this conftest (the first call of this hook is for this module, or for a
    plugin registered before it), before it imports a deeper conftest or any test, when lmcache_adp._native
    was built from other C++ sources than this tree's or is missing: the message names the module and the
    rebuild command. Raised here, not at import, as pytest reports an exception raised while it imports a
    conftest as an "ImportError while loading conftest" traceback, and a UsageError from here as the
    message alone."""
    if STALE is not None and not allowed():
        raise pytest.UsageError(STALE)


def pytest_collection_finish(session):
    """Stops the session before its first test when collecting it changed an ADP_* variable: bench_l2.py set
    ADP_LOG_LEVEL=WARNING as a test imported it, and every gateway started after it kept its INFO ready line to
    itself, so each gateway test waited 60 s and failed (CI ran out of time)."""
    if changed := environment_changes(ADP_ENV_AT_START):
        raise pytest.UsageError(f"collecting the tests changed the environment the tests' children inherit: {changed}")


def environment_changes(before: dict[str, str]) -> str:
    """The ADP_* variables of os.environ that differ from `before`, as 'NAME: old -> new', or ''."""
    now = adp_environment()
    return "; ".join(
        f"{k}: {before.get(k, '(unset)')} -> {now.get(k, '(unset)')}"
        for k in sorted(before.keys() | now.keys())
        if before.get(k) != now.get(k)
    )


def pytest_sessionstart(session):
    """ADP_ALLOW_STALE_NATIVE=1: the tests run on such a module, with the message as a warning. An ADP_TEST_
    variable the session started with that is no test hook (misspelt, or a hook removed) stops it: every gateway
    and connector the tests start would inherit it, and it does nothing (each logs it at WARNING, once)."""
    if STALE is not None:
        warnings.warn(f"{STALE}\n{ALLOW}=1: testing it anyway", stacklevel=1)
    if unknown := unknown_test_hooks(os.environ):
        raise pytest.UsageError(
            f"{', '.join(unknown)}: set in the environment the tests started with, but not a test hook: it would "
            "do nothing (misspelt, or a hook removed?). The hooks: docs/testing.md"
        )


def unknown_test_hooks(env) -> list[str]:
    """The ADP_TEST_ names of `env` that the native module reads as no hook (none where the module is one allowed
    stale, without the table, or not built: the sanitizer runs compile tests/cpp programs and need no module, and
    session 31's first form imported it here unasked and stopped every such session)."""
    named = [k for k in env if k.startswith("ADP_TEST_")]
    if not named:
        return []
    try:
        from lmcache_adp import _native
    except ImportError:
        return []
    known = getattr(_native, "known_test_hooks", None)
    if known is None:
        return []
    names = set(known())
    return sorted(k for k in named if k not in names)


@pytest.fixture
def card(tmp_path):
    """Path of a card image that does not exist yet (created on first open)."""
    return str(tmp_path / "cards" / "card.img")


@pytest.fixture
def shm_dir(request):
    """A fresh directory on /dev/shm (tmpfs: a memory-speed card's image, a segment's shared memory file) for the
    C++ programs and cards a test runs there, named after the test's module and removed afterwards."""
    shm = Path("/dev/shm")
    assert shm.is_dir() and os.access(shm, os.W_OK), "this test needs a writable /dev/shm (tmpfs)"
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    d = tempfile.mkdtemp(prefix=f"adp-{name}-", dir=shm)
    yield d
    shutil.rmtree(d, ignore_errors=True)
