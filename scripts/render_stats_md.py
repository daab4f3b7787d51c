# SPDX-License-Identifier: Apache-2.0
"""Writes docs/stats.md from lmcache_adp/stats_catalog.py (the one table of
stats) of this tree; tests/ops/test_stats_catalog.py fails until they agree."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's lmcache_adp, not an installed one

from lmcache_adp.stats_catalog import render_markdown  # noqa: E402

if __name__ == "__main__":
    (ROOT / "docs" / "stats.md").write_text(render_markdown())
    print(f"wrote {ROOT / 'docs' / 'stats.md'}")
