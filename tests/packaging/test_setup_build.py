# SPDX-License-Identifier: Apache-2.0
"""setup.py's build_ext judges an up-to-date module by the sources it records, not by file times alone:
an edit saved while a build compiled is older than that build's module, and a build by times alone
skipped it until the file was touched again (session six's closing note)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from lmcache_adp.source_digest import MARKER, source_digest

ROOT = Path(__file__).resolve().parents[2]


def dry_build(tree: Path, recorded: str) -> str:
    """`setup.py build_ext --inplace --dry-run` in `tree` (nothing is compiled) after a build whose module
    records `recorded` and is newer than every source; its output."""
    built = tree / "build" / "lib" / "lmcache_adp" / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    built.parent.mkdir(parents=True, exist_ok=True)
    built.write_bytes(b"\x7fELF..." + MARKER + recorded.encode() + b"\0...")
    future = 4_000_000_000  # 2096: newer than any source
    os.utime(built, (future, future))
    r = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace", "--dry-run", "--build-lib", "build/lib"],
        cwd=tree, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return r.stdout + r.stderr


def test_build_ext_rebuilds_a_module_of_other_sources_though_it_is_newer(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy(ROOT / name, tree)
    for name in ("lmcache_adp", "src_cpp"):
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    now = source_digest(tree)

    building = "building 'lmcache_adp._native' extension"
    out = dry_build(tree, now)
    assert "running build_ext" in out and building not in out, out[-3000:]  # up to date: skipped

    out = dry_build(tree, "0" * 64)  # the sources changed after the build read them
    assert building in out and "src_cpp/store/card_store.cc" in out, out[-3000:]
