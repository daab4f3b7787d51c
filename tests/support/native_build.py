# SPDX-License-Identifier: Apache-2.0
"""Whether the imported lmcache_adp._native was built from this tree's C++ sources (tests/conftest.py asks it as
pytest loads it, before any deeper conftest). A module built from other sources (an in-place build left from an
older checkout, or a worktree without one of its own importing another tree's through an editable install) fails
tests in ways that point nowhere near the cause ("empty key", a missing stat); the suite stops at once instead,
naming the module and the command that rebuilds it.

Standard library only, and nothing of lmcache_adp is imported: its __init__ reads the module's attributes
(config.py: _native.MAX_TOKEN_BYTES, ...), so importing a stale module can fail with an AttributeError that
pytest shows as an INTERNALERROR traceback, not this message (review r10 N6). The module is found where
`import lmcache_adp._native` would find it and judged by the source digest recorded in its bytes."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from pathlib import Path

# Set to 1 to run the tests anyway (a warning instead of the error); the package's own check
# (lmcache_adp/native_check.py) reads it too.
ALLOW = "ADP_ALLOW_STALE_NATIVE"
# The tree this file is in.
HERE = Path(__file__).resolve().parents[2]


def _digests(tree: Path):
    """lmcache_adp/source_digest.py of `tree`, loaded by path (source_digest, recorded_digest)."""
    spec = importlib.util.spec_from_file_location("adp_source_digest", tree / "lmcache_adp" / "source_digest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rebuild_command(tree: Path) -> str:
    return _digests(tree).rebuild_command(tree)


def _source_digest(tree: Path) -> str:
    """The digest setup.py records."""
    return _digests(tree).source_digest(tree)


def native_file(tree: Path = HERE) -> tuple[Path | None, list[str]]:
    """The file `import lmcache_adp._native` would load, found without importing lmcache_adp: the first of
    the package's directories holding one, and in it the file `tree`'s source_digest.native_module() picks
    (the interpreter's extension suffixes, in the import system's order; benchmarks/tools.py's native_build
    picks by the same); None if there is none. Also the directories looked in ([] if lmcache_adp is not
    found)."""
    spec = importlib.util.find_spec("lmcache_adp")
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    pick = _digests(Path(tree)).native_module
    for d in dirs:
        if (found := pick(Path(d))) is not None:
            return found, dirs
    return None, dirs


def stale_native(module_file: str, built_from: str, tree: Path, tree_digest: str | None = None) -> str | None:
    """Why the native module at `module_file`, which records the source digest `built_from` (its
    SOURCE_DIGEST: "" if it was built without one), must not be tested as `tree`'s: None if it was built
    from `tree`'s C++ sources (`tree_digest`, computed from `tree` if not given)."""
    tree = Path(tree).resolve()
    now = tree_digest if tree_digest is not None else _source_digest(tree)
    if built_from == now:
        return None
    module = Path(module_file).resolve()
    where = "" if module.parent == tree / "lmcache_adp" else f" (not this tree's: no in-place build in {tree})"
    recorded = f"sources {built_from[:12]}" if built_from else "no source digest (built outside setup.py)"
    return (
        f"lmcache_adp._native is not built from this tree's C++ sources:\n"
        f"  module: {module}{where}, {recorded}\n"
        f"  tree:   {tree}, src_cpp digest {now[:12]}\n"
        f'Tests against it fail in ways that point elsewhere ("empty key", missing stats). Rebuild in place:\n'
        f"  {rebuild_command(tree)}\n"
        f"(or `pip install -e .`; {ALLOW}=1 runs the tests anyway)"
    )


def check_native(tree: Path) -> str | None:
    """stale_native() for the lmcache_adp._native that would import here (native_file(): nothing of
    lmcache_adp is imported), judged by the digest recorded in its bytes; no such module is reported with the
    rebuild command too. (A module whose digest matches but that does not import, e.g. a broken link, fails
    the tests that import it with Python's ImportError.)"""
    tree = Path(tree)
    module, dirs = native_file(tree)
    if module is None:
        where = f"in {', '.join(dirs)}" if dirs else "(lmcache_adp is not on sys.path)"
        return (
            f"no built lmcache_adp._native (_native{importlib.machinery.EXTENSION_SUFFIXES[0]}) {where}. "
            f"Build it in place:\n  {rebuild_command(tree)}"
        )
    return stale_native(str(module), _digests(tree).recorded_digest(module) or "", tree)


def allowed() -> bool:
    return os.environ.get(ALLOW) == "1"
