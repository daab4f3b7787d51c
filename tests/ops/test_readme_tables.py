# SPDX-License-Identifier: Apache-2.0
"""README's reference tables against the code they describe: every
`lmcache-adp` option (the argparse parsers) has a row in "Command line", every
adapter_params key (lmcache_adp.config.PARAMS) one in "adapter_params", and
neither table lists one the code lacks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmcache_adp import _native
from lmcache_adp.cli import build_parser
from lmcache_adp.config import PARAMS

README = Path(__file__).resolve().parents[2] / "README.md"


def section(title: str) -> str:
    text = README.read_text()
    out = text[text.index(title) :]
    return out[: out.index("\n#")]


def subcommands() -> dict:
    return next(a for a in build_parser()._actions if a.dest == "command").choices


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_readme_lists_every_option(command):
    parser = subcommands()[command]
    flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    cells = re.findall(rf"^\| `({command} [^`]*)`", section("### Command line (`lmcache-adp`)"), re.MULTILINE)
    rows = {f for cell in cells for f in re.findall(r"--[a-z0-9-]+", cell)}
    missing, stale = sorted(flags - rows), sorted(rows - flags)
    assert not missing, f"`lmcache-adp {command}` options {missing} have no row in README.md's 'Command line' table"
    assert not stale, f"README.md's 'Command line' table lists `{command}` options {stale} the parser does not have"


def test_readme_lists_every_adapter_param():
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", section("### adapter_params"), re.MULTILINE))
    missing, stale = sorted(set(PARAMS) - rows), sorted(rows - set(PARAMS))
    assert not missing, f"adapter_params {missing} (lmcache_adp/config.py PARAMS) have no row in README.md's table"
    assert not stale, f"README.md's adapter_params table lists {stale}, which lmcache_adp/config.py does not accept"


def test_docs_name_the_protocol_and_format_versions_the_code_speaks():
    """docs/protocol.md and docs/card_format.md open with the version they describe; the code's constants
    (src_cpp/protocol/frame.h kProtocolVersion, src_cpp/store/card_format.h kFormatVersion) are what a gateway
    speaks and a card holds (review34: nothing tied the headings to the constants, so a bump of either could
    leave its document describing the previous version)."""
    docs = README.parent / "docs"
    protocol = re.match(r"# Gateway protocol, version (\d+)\n", (docs / "protocol.md").read_text())
    card = re.match(r"# On-card format, version (\d+)\n", (docs / "card_format.md").read_text())
    assert protocol and int(protocol.group(1)) == _native.PROTOCOL_VERSION, "docs/protocol.md's heading"
    assert card and int(card.group(1)) == _native.FORMAT_VERSION, "docs/card_format.md's heading"
