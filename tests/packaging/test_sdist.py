# SPDX-License-Identifier: Apache-2.0
"""`python setup.py sdist` packs what setup.py needs to build from the unpacked archive (review r15 N6: it held
no src_cpp header and no scripts/object_stamps.py, which setup.py exec()s at import, so an sdist install failed
at setup.py's first lines). MANIFEST.in says what goes in; docs/building.md, "Source distribution". The archive
is made from a copy of this tree's files (tracked, and untracked ones git does not ignore), so the checkout is
not written to. Compiling the unpacked archive (minutes here) is not done: its src_cpp is checked instead to
be this tree's, file for file (the source digest setup.py records)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from lmcache_adp._version import __version__
from lmcache_adp.source_digest import source_digest

ROOT = Path(__file__).resolve().parents[2]
# What setup.py reads before it compiles (exec or read_text), beside the sources.
SETUP_READS = ("setup.py", "pyproject.toml", "README.md", "lmcache_adp/source_digest.py",
               "lmcache_adp/_version.py", "scripts/object_stamps.py")  # fmt: skip


def test_the_sdist_holds_what_its_build_needs_and_its_setup_py_runs(tmp_path):
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    tree = tmp_path / "tree"
    for rel in filter(None, (f.decode() for f in files)):
        if (ROOT / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes((ROOT / rel).read_bytes())
    r = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path / "dist")],
        cwd=tree, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (archive,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(archive) as t:
        t.extractall(tmp_path / "unpacked", filter="data")
    (top,) = (tmp_path / "unpacked").iterdir()
    missing = [rel for rel in SETUP_READS + ("lmcache_adp/_native.pyi", "LICENSE") if not (top / rel).is_file()]
    assert not missing, missing
    # Every .cc and .h of src_cpp, with the same bytes: the headers were missing.
    headers = sorted(p.relative_to(top).as_posix() for p in (top / "src_cpp").rglob("*.h"))
    assert "src_cpp/store/card_store.h" in headers, headers
    assert source_digest(top) == source_digest(ROOT)
    r = subprocess.run([sys.executable, "setup.py", "--version"], cwd=top, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == __version__, r.stdout + r.stderr
