# SPDX-License-Identifier: Apache-2.0
"""tests/conftest.py stops the session before any test when lmcache_adp._native was built from other C++
sources than the tree's (tests/support/native_build.py): an engineer's stale in-place build gave "empty key"
failures instead of a clear error."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lmcache_adp._native as native
from lmcache_adp.source_digest import MARKER, source_digest
from tests.support.native_build import ALLOW, check_native, native_file, stale_native

ROOT = Path(__file__).resolve().parents[2]


def test_this_trees_module_passes():
    assert native.SOURCE_DIGEST == source_digest(ROOT)
    assert stale_native(native.__file__, native.SOURCE_DIGEST, ROOT) is None
    assert check_native(ROOT) is None
    assert native_file() == (Path(native.__file__), [str(ROOT / "lmcache_adp")])


def test_a_module_of_other_sources_is_named_with_the_rebuild_command():
    other = "f" * 64
    why = stale_native(native.__file__, other, ROOT)
    assert why is not None
    assert f"module: {Path(native.__file__).resolve()}, sources ffffffffffff" in why, why
    assert f"src_cpp digest {source_digest(ROOT)[:12]}" in why, why
    assert f"cd {ROOT} && ADP_WERROR=1 python setup.py -q build_ext --inplace" in why, why
    assert "not this tree's" not in why, why  # the module is the tree's in-place one
    # Another tree's module (a worktree with no build of its own, importing main's through pip install -e).
    why = stale_native("/elsewhere/lmcache_adp/_native.so", other, ROOT, tree_digest="0" * 64)
    assert f"/elsewhere/lmcache_adp/_native.so (not this tree's: no in-place build in {ROOT})" in why, why
    why = stale_native(native.__file__, "", ROOT)  # built outside setup.py
    assert "no source digest (built outside setup.py)" in why, why


# The name `import lmcache_adp._native` looks for first (an extension module for this interpreter).
SO_NAME = "_native" + importlib.machinery.EXTENSION_SUFFIXES[0]
# What a stale module's import does to lmcache_adp/__init__ (config.py reads _native.MAX_TOKEN_BYTES at import).
MISSING_ATTRIBUTE = "raise AttributeError(\"module 'lmcache_adp._native' has no attribute 'MAX_TOKEN_BYTES'\")\n"


def fake_tree(tmp_path: Path, module: bytes | None, init_py: str = "") -> Path:
    """A tree with the real conftest, check and digest code, and pyproject.toml, but a tiny src_cpp, an
    lmcache_adp/__init__.py of `init_py` and a native module file of the bytes `module` (none if None: the
    check reads it, never loads it); one test that passes (it imports nothing of lmcache_adp)."""
    tree = tmp_path / "tree"
    for rel in (
        "pyproject.toml", "tests/__init__.py", "tests/conftest.py", "tests/support/__init__.py",
        "tests/support/native_build.py", "lmcache_adp/source_digest.py",
    ):  # fmt: skip
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tree / rel)
    (tree / "lmcache_adp" / "__init__.py").write_text(init_py)
    if module is not None:
        (tree / "lmcache_adp" / SO_NAME).write_bytes(module)
    (tree / "src_cpp").mkdir()
    (tree / "src_cpp" / "a.cc").write_text("int a() { return 1; }\n")
    (tree / "tests" / "test_one.py").write_text("def test_one():\n    pass\n")
    return tree


def built_from(digest: str) -> bytes:
    """A module's bytes as setup.py leaves them: the source digest after its marker, amid other bytes."""
    return b"\x7fELF..." + MARKER + digest.encode() + b"\0..."


def run_pytest(tree: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """pytest in `tree` on `args` (the tests directory if none)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(args or ("tests",))],
        cwd=tree, capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip


def test_the_session_stops_before_any_test_on_a_stale_module(tmp_path):
    tree = fake_tree(tmp_path, built_from("e" * 64))
    r = run_pytest(tree, **{ALLOW: "0"})
    out = r.stdout + r.stderr
    assert r.returncode == 4, out  # a usage error: no test ran
    assert "test_one" not in out and "passed" not in out, out
    assert "not built from this tree's C++ sources" in out and f"{tree}/lmcache_adp/{SO_NAME}" in out, out
    assert "sources eeeeeeeeeeee" in out, out
    assert f"cd {tree} && ADP_WERROR=1 python setup.py -q build_ext --inplace" in out, out

    # ADP_ALLOW_STALE_NATIVE=1: the tests run, with the message as a warning.
    r = run_pytest(tree, **{ALLOW: "1"})
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "1 passed" in out and "not built from this tree's" in out, out


def test_a_module_of_this_trees_sources_passes_without_lmcache_adp_imported(tmp_path):
    """The fake tree's own digest in the module: the one test runs, and the check imported nothing of
    lmcache_adp (whose __init__ would raise here)."""
    tree = fake_tree(tmp_path, None, MISSING_ATTRIBUTE)
    (tree / "lmcache_adp" / SO_NAME).write_bytes(built_from(source_digest(tree)))
    r = run_pytest(tree, **{ALLOW: "0"})
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "1 passed" in out, out


def test_a_stale_module_missing_an_attribute_gets_the_message_not_an_internal_error(tmp_path):
    """Review r10 N6: a stale module that imports but lacks an attribute lmcache_adp/__init__ reads
    (AttributeError, not ImportError) stopped the session with an INTERNALERROR traceback while the check
    imported lmcache_adp._native; judged from its bytes, it gets the stale message. Review r11 N12: so too
    when pytest is given a test file under a directory whose conftest imports lmcache_adp (as
    tests/gateway/conftest.py does): pytest loads that conftest before the session starts, and the check
    there came too late (an "ImportError while loading conftest" traceback of the AttributeError)."""
    tree = fake_tree(tmp_path, built_from("e" * 64), MISSING_ATTRIBUTE)
    deeper = tree / "tests" / "gateway"
    deeper.mkdir()
    (deeper / "__init__.py").write_text("")
    (deeper / "conftest.py").write_text("import lmcache_adp  # noqa: F401\n")
    (deeper / "test_two.py").write_text("def test_two():\n    pass\n")
    for args in [(), ("tests/gateway/test_two.py",), ("tests/gateway",)]:
        r = run_pytest(tree, *args, **{ALLOW: "0"})
        out = r.stdout + r.stderr
        assert r.returncode == 4 and "passed" not in out, (args, out)
        assert "INTERNALERROR" not in out and "AttributeError" not in out and "ImportError" not in out, (args, out)
        assert "not built from this tree's C++ sources" in out and "build_ext --inplace" in out, (args, out)

    # ADP_ALLOW_STALE_NATIVE=1 on that test file: the deeper conftest is loaded (and fails as it would).
    r = run_pytest(tree, "tests/gateway/test_two.py", **{ALLOW: "1"})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "ImportError while loading conftest" in out and "MAX_TOKEN_BYTES" in out, out


def test_the_session_stops_without_a_built_module_or_one_without_a_digest(tmp_path):
    tree = fake_tree(tmp_path, None)
    r = run_pytest(tree, **{ALLOW: "0"})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "passed" not in out, out
    assert f"no built lmcache_adp._native ({SO_NAME}) in {tree}/lmcache_adp" in out, out
    assert "build_ext --inplace" in out, out

    (tree / "lmcache_adp" / SO_NAME).write_bytes(b"\x7fELF... built by hand, no digest")
    r = run_pytest(tree, **{ALLOW: "0"})
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "passed" not in out, out
    assert "no source digest (built outside setup.py)" in out and "build_ext --inplace" in out, out
