# SPDX-License-Identifier: Apache-2.0
"""The ADP_TEST_* hooks (src_cpp/util/test_hooks.{h,cc}): read in that one place, once at a gateway's or
connector's start, each one set logged at WARNING then; docs/testing.md lists them all."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmcache_adp import ADPConnector, _native
from tests.support.gateway import temp_gateway

ROOT = Path(__file__).resolve().parents[2]
HOOKS_CC = ROOT / "src_cpp" / "util" / "test_hooks.cc"


def hook_names(text: str) -> set[str]:
    return set(re.findall(r"\bADP_TEST_[A-Z0-9_]+\b", text))


def test_hooks_are_read_in_one_place_and_documented():
    """No source but test_hooks.cc reads an ADP_TEST_ variable, and docs/testing.md's table lists exactly
    the hooks it reads."""
    readers = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "src_cpp").rglob("*"))
        if p.suffix in (".cc", ".h") and p != HOOKS_CC and re.search(r'getenv\(\s*"ADP_TEST_', p.read_text())
    ]
    assert readers == [], f"ADP_TEST_ variables read outside {HOOKS_CC.name}: {readers}"
    read = hook_names(HOOKS_CC.read_text())
    assert len(read) >= 13, read
    doc = (ROOT / "docs" / "testing.md").read_text()
    table = {m for line in doc.splitlines() if line.startswith("| `ADP_TEST_") for m in hook_names(line.split("|")[1])}
    assert table == read, f"only in the code: {sorted(read - table)}; only in the docs: {sorted(table - read)}"


def test_set_hooks_are_logged_when_the_gateway_starts():
    with temp_gateway() as gw:
        assert "test hook" not in gw.log(), gw.log()
    hooks = {"ADP_TEST_SEGMENT_WRITE_DELAY_MS": "7", "ADP_TEST_PROCESS_READ_STALL_AT": "start"}
    with temp_gateway(env=hooks) as gw:
        lines = [line for line in gw.log().splitlines() if "test hook" in line]
    assert len(lines) == 2, lines
    for line, (name, value) in zip(lines, hooks.items(), strict=True):
        assert "WARNING" in line and f"gateway: test hook {name}={value} is set (" in line, line
        assert line.endswith("): this process is not for production"), line


def test_set_hooks_are_logged_when_a_connector_starts(tmp_path, monkeypatch, capfd):
    """Only the connector's own hooks: a gateway hook in its environment is the gateway's to log."""
    card = str(tmp_path / "card.img")
    ADPConnector(card=card, card_size_gb=0.0625, num_workers=1).close()
    assert "test hook" not in capfd.readouterr().err
    monkeypatch.setenv("ADP_TEST_DELIVERY_DELAY_MS", "3")
    monkeypatch.setenv("ADP_TEST_SEGMENT_WRITE_DELAY_MS", "5")
    ADPConnector(card=card, num_workers=1).close()
    lines = [line for line in capfd.readouterr().err.splitlines() if "test hook" in line]
    assert len(lines) == 1, lines
    assert "WARNING" in lines[0] and "connector: test hook ADP_TEST_DELIVERY_DELAY_MS=3 is set (" in lines[0], lines
    assert lines[0].endswith("): this process is not for production"), lines


def unknown_name(what: str) -> str:
    """An ADP_TEST_ name no hook has, new to this process (each is logged once per process), put together here so
    that test_the_tree_names_only_known_hooks does not read it as a misspelt hook."""
    return "ADP_TEST_" + f"NO_SUCH_{what}_{time.monotonic_ns()}"


def test_an_unknown_hook_is_logged_once_by_a_connector(tmp_path, monkeypatch, capfd):
    """Brief start31: a misspelt or removed ADP_TEST_ variable (the connect timeout's after session 30) did
    nothing and said nothing. Now a WARNING names it where the hooks are read, once per process: two connectors
    started in the same environment say it once."""
    name = unknown_name("CONNECTOR")
    monkeypatch.setenv(name, "5")
    card = str(tmp_path / "card.img")
    ADPConnector(card=card, card_size_gb=0.0625, num_workers=1).close()
    ADPConnector(card=card, num_workers=1).close()
    lines = [line for line in capfd.readouterr().err.splitlines() if name in line]
    assert len(lines) == 1, lines
    assert " WARNING: " in lines[0] and f"connector: {name} is set but is not a known test hook" in lines[0], lines


def test_an_unknown_hook_is_logged_when_the_gateway_starts():
    name = unknown_name("GATEWAY")
    with temp_gateway(env={name: "1", "ADP_TEST_SEGMENT_WRITE_DELAY_MS": "7"}) as gw:
        log = gw.log()
    lines = [line for line in log.splitlines() if name in line]
    assert len(lines) == 1 and " WARNING: " in lines[0], log
    assert f"gateway: {name} is set but is not a known test hook: it does nothing" in lines[0], lines
    assert "gateway: test hook ADP_TEST_SEGMENT_WRITE_DELAY_MS=7 is set (" in log, log  # a known one as before


def test_the_tree_names_only_known_hooks():
    """Every ADP_TEST_ name written in the tree's sources, tests, scripts and docs is a hook the native module
    reads: a test that sets a misspelt or removed one (env={...}, setenv) fails here, not for another reason.
    (ADP_TEST_X: docs/testing.md's placeholder.)"""
    known = hook_names(HOOKS_CC.read_text())
    unknown = []
    for top in ("src_cpp", "lmcache_adp", "tests", "benchmarks", "scripts", "docs", ".ci", "examples", "docker"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix not in (".py", ".cc", ".h", ".c", ".sh", ".md", ".yml", ".yaml", ".toml", ".txt", ".json"):
                continue
            if "results" in p.relative_to(ROOT).parts:  # benchmarks/results: logs of their day
                continue
            for name in sorted(set(re.findall(r"\bADP_TEST_[A-Z0-9_]*[A-Z0-9]\b", p.read_text(errors="replace")))):
                if name not in known and name != "ADP_TEST_X":
                    unknown.append(f"{p.relative_to(ROOT)}: {name}")
    assert unknown == [], unknown
    assert set(_native.known_test_hooks()) == known, "the module's table (tests/conftest.py's) is not test_hooks.cc's"


def test_a_session_started_with_an_unknown_hook_stops():
    """tests/conftest.py: a pytest session whose environment holds an ADP_TEST_ name that is no hook stops before
    its first test (every gateway and connector it starts would inherit a variable that does nothing)."""
    name = unknown_name("SESSION")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::test_hooks_are_read_in_one_place_and_documented"],
        cwd=ROOT, env={**os.environ, name: "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert f"{name}: set in the environment the tests started with, but not a test hook" in out, out
    assert "1 passed" not in out, out


def test_the_session_check_needs_no_native_module_unless_a_hook_is_named(monkeypatch):
    """The sanitizer runs (scripts/device_sanitize.sh) compile tests/cpp programs and run with no lmcache_adp
    built: the session check must not import the module when no ADP_TEST_ name is set (its first form did, and
    stopped every such session with an INTERNALERROR), nor stop a session it cannot check."""
    import lmcache_adp
    from tests.conftest import unknown_test_hooks

    monkeypatch.delattr(lmcache_adp, "_native")
    monkeypatch.setitem(sys.modules, "lmcache_adp._native", None)  # the import fails, as where it is not built
    with pytest.raises(ImportError):
        from lmcache_adp import _native  # noqa: F401
    assert unknown_test_hooks({"PATH": "/bin", "ADP_LOG_LEVEL": "INFO"}) == []
    assert unknown_test_hooks({unknown_name("NOCHECK"): "1"}) == []  # cannot be checked: the tests say why
