# SPDX-License-Identifier: Apache-2.0
"""The package's own check of its native module (lmcache_adp/native_check.py): where lmcache_adp sits in a
source tree, a _native built from other sources than the src_cpp/ beside it stops `lmcache-adp` and
ADPConnector(...) with one line naming the rebuild command, where it gave a 30-line pybind TypeError (audit 15
item 23). The trees here are copies of this one's package (its real, current module) and src_cpp."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from lmcache_adp.native_check import ALLOW

ROOT = Path(__file__).resolve().parents[2]
CONNECT = (
    "from lmcache_adp import ADPConnector\n"
    "try:\n"
    "    ADPConnector(card={card!r})\n"
    "except RuntimeError as e:\n"
    "    print('RuntimeError:', e)\n"
)


def tree_copy(tmp_path: Path, *, edit: bool) -> Path:
    """This tree's lmcache_adp (with its built module) and src_cpp, under tmp_path/tree; `edit`: one source
    gets a comment more, as a rebase or a landed change gives a tree whose module nobody rebuilt."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "lmcache_adp", tree / "lmcache_adp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "src_cpp", tree / "src_cpp")
    if edit:
        with open(tree / "src_cpp" / "store" / "verify.cc", "a") as f:
            f.write("// landed after the build\n")
    return tree


def run_in(tree: Path, *args: str, allow: str = "0") -> subprocess.CompletedProcess:
    """python `args` with `tree` first on sys.path (its own lmcache_adp, not the one under test)."""
    env = {**os.environ, "PYTHONPATH": str(tree), ALLOW: allow}
    return subprocess.run([sys.executable, *args], cwd=tree, capture_output=True, text=True, timeout=120, env=env)


def test_a_module_of_other_sources_stops_the_cli_and_the_connector_in_one_line(tmp_path):
    tree = tree_copy(tmp_path, edit=True)
    card = str(tmp_path / "card.img")
    module = tree / "lmcache_adp" / Path(__import__("lmcache_adp._native").__dict__["_native"].__file__).name
    r = run_in(tree, "-m", "lmcache_adp.cli", "status", "--card", card)
    assert r.returncode == 3 and r.stdout == "", r.stdout + r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"lmcache-adp: error: lmcache_adp._native ({module}, sources "), line
    assert f"was built from other C++ sources than {tree}/src_cpp (digest " in line, line
    assert line.endswith(f"rebuild it: cd {tree} && ADP_WERROR=1 python setup.py -q build_ext --inplace"), line

    r = run_in(tree, "-c", CONNECT.format(card=card))
    assert r.returncode == 0 and r.stdout.startswith("RuntimeError: ADPConnector not started: lmcache_adp._native ("), (
        r.stdout + r.stderr
    )
    assert r.stdout.strip().endswith("build_ext --inplace") and not os.path.exists(card), r.stdout + r.stderr

    # ADP_ALLOW_STALE_NATIVE=1: a WARNING, and the command goes on (to its own error here: no card).
    r = run_in(tree, "-m", "lmcache_adp.cli", "status", "--card", card, allow="1")
    assert r.returncode == 2 and f"card {card} does not exist" in r.stderr, r.stderr
    assert "WARNING" in r.stderr and "was built from other C++ sources" in r.stderr and f"{ALLOW}=1" in r.stderr


def test_a_module_of_the_sources_beside_it_or_of_no_source_tree_passes(tmp_path):
    """The tree's own sources: no line; a package with no src_cpp/ beside it (a wheel, the image): nothing
    to judge."""
    tree = tree_copy(tmp_path, edit=False)
    card = str(tmp_path / "card.img")
    r = run_in(tree, "-m", "lmcache_adp.cli", "status", "--card", card)
    assert r.returncode == 2 and r.stderr == f"lmcache-adp: error: card {card} does not exist\n", r.stderr
    r = run_in(tree, "-c", CONNECT.format(card=str(tmp_path / "new.img")) + "else:\n    print('started')\n")
    assert r.stdout.splitlines()[-1] == "started", r.stdout + r.stderr

    with open(tree / "src_cpp" / "store" / "verify.cc", "a") as f:
        f.write("// landed after the build\n")
    shutil.move(tree / "src_cpp", tmp_path / "elsewhere")
    r = run_in(tree, "-m", "lmcache_adp.cli", "status", "--card", card)
    assert r.returncode == 2 and r.stderr == f"lmcache-adp: error: card {card} does not exist\n", r.stderr


def test_a_module_that_fails_the_package_import_is_named_so_when_stale(tmp_path):
    """A module of other sources may lack a name lmcache_adp reads at import (config.py reads _native's
    constants): `import lmcache_adp` ended in Python's AttributeError; now in the same one line, judged from the
    module's bytes. The same failure with the tree's own sources stays Python's error (it is not the build)."""
    for edit in (True, False):
        tree = tree_copy(tmp_path / str(edit), edit=edit)
        with open(tree / "lmcache_adp" / "config.py", "a") as f:  # as if this build lacked a name config.py reads
            f.write("\n_native.NOT_IN_THIS_BUILD\n")
        r = run_in(tree, "-c", "import lmcache_adp")
        last = r.stderr.strip().splitlines()[-1]
        if edit:
            assert r.returncode == 1 and "AttributeError" not in r.stderr, r.stderr
            assert last.startswith("ImportError: lmcache_adp._native (") and last.endswith("build_ext --inplace"), last
        else:
            assert r.returncode == 1 and last.endswith("has no attribute 'NOT_IN_THIS_BUILD'"), r.stderr


# As setuptools' editable install of another checkout: a finder after the path finder that serves the package's
# native module from that tree where the package's own directory has none (review r16); before any real one.
EDITABLE_ELSEWHERE = (
    "import importlib.machinery, importlib.util, runpy, sys\n"
    "class Editable:\n"
    "    @staticmethod\n"
    "    def find_spec(name, path=None, target=None):\n"
    "        if name == 'lmcache_adp._native':\n"
    "            return importlib.util.spec_from_file_location(name, {module!r})\n"
    "sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, Editable)\n"
    "sys.argv = ['lmcache-adp', *{args!r}]\n"
    "runpy.run_module('lmcache_adp.cli', run_name='__main__')\n"
)


def test_a_source_tree_with_no_module_built_is_named_so(tmp_path):
    """A fresh clone or a new worktree, nothing built in its package (review r16): `import lmcache_adp` ended in
    Python's "No module named 'lmcache_adp._native'"; and where an editable install of another checkout served
    the name, `lmcache-adp` ran on that tree's module, judged against that tree's sources (passed, or named that
    tree's rebuild). Now both name this tree's package as not built and this tree's rebuild command."""
    tree = tree_copy(tmp_path / "fresh", edit=True)
    for built in (tree / "lmcache_adp").glob("_native*.so"):
        built.unlink()
    rebuild = f"build it: cd {tree} && ADP_WERROR=1 python setup.py -q build_ext --inplace"

    r = run_in(tree, "-S", "-c", "import lmcache_adp")  # -S: no site-packages, so no editable install either
    last = r.stderr.strip().splitlines()[-1]
    assert (
        r.returncode == 1 and last == f"ImportError: lmcache_adp._native is not built in {tree}/lmcache_adp: {rebuild}"
    )

    other = tree_copy(tmp_path / "other", edit=False)  # built, and current for its own sources
    (module,) = (other / "lmcache_adp").glob("_native*.so")
    card = str(tmp_path / "card.img")
    r = run_in(tree, "-c", EDITABLE_ELSEWHERE.format(module=str(module), args=["status", "--card", card]))
    assert r.returncode == 3 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"lmcache-adp: error: lmcache_adp._native is not built in {tree}/lmcache_adp; {module} was imported in its "
        f"place, another tree's: {rebuild}"
    ], r.stderr
