# SPDX-License-Identifier: Apache-2.0
"""Whether the imported lmcache_adp._native was built from this tree's C++ sources (tests/conftest.py asks it
at session start). A module built from other sources (an in-place build left from an older checkout, or a
worktree without one of its own importing another tree's through an editable install) fails tests in ways
that point nowhere near the cause ("empty key", a missing stat); the suite stops at once instead, naming the
module and the command that rebuilds it.

Standard library only: it must not import lmcache_adp before it has judged the module."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

# Set to 1 to run the tests anyway (a warning instead of the error).
ALLOW = "ADP_ALLOW_STALE_NATIVE"


def rebuild_command(tree: Path) -> str:
    return f"cd {tree} && ADP_WERROR=1 python setup.py -q build_ext --inplace"


def _source_digest(tree: Path) -> str:
    """The digest setup.py records (lmcache_adp/source_digest.py of `tree`, loaded by path)."""
    spec = importlib.util.spec_from_file_location("adp_source_digest", tree / "lmcache_adp" / "source_digest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.source_digest(tree)


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
    """stale_native() for the lmcache_adp._native that imports here; a module that does not import is
    reported the same way (it may be built for other sources' symbols)."""
    try:
        native = importlib.import_module("lmcache_adp._native")
    except ImportError as e:
        return f"lmcache_adp._native does not import ({e}). Build it in place:\n  {rebuild_command(Path(tree))}"
    return stale_native(native.__file__, getattr(native, "SOURCE_DIGEST", ""), tree)


def allowed() -> bool:
    return os.environ.get(ALLOW) == "1"
