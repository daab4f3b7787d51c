# SPDX-License-Identifier: Apache-2.0
"""The ADP_TEST_* hooks (src_cpp/util/test_hooks.{h,cc}): read in that one place, once at a gateway's or
connector's start, each one set logged at WARNING then; docs/testing.md lists them all."""

from __future__ import annotations

import re
from pathlib import Path

from lmcache_adp import ADPConnector
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
