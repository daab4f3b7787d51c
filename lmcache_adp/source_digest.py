# SPDX-License-Identifier: Apache-2.0
"""The digest of a tree's C++ sources, which setup.py compiles into the native module
(`_native.SOURCE_DIGEST`) so that a build can be judged stale by content, not by file times:
a rebase or a checkout rewrites files and their times without changing what is built.

Also which file in a package directory is the native module (native_module), for the two
that judge a build without importing it (tests/support/native_build.py, benchmarks/tools.py).

Standard library only, no package imports: setup.py loads this file by path before the
extension exists."""

from __future__ import annotations

import hashlib
import importlib.machinery
import re
from pathlib import Path

# Marks the digest inside the module's bytes, so a build can be judged without importing it.
MARKER = b"adp-source-digest:"


def source_digest(tree: Path) -> str:
    """sha256 (hex) over every src_cpp/**/*.cc and *.h of `tree`: each file's path (relative, '/'
    separated) and contents, in path order."""
    h = hashlib.sha256()
    src = Path(tree) / "src_cpp"
    for p in sorted(p for p in src.rglob("*") if p.suffix in (".cc", ".h") and p.is_file()):
        rel = p.relative_to(tree).as_posix().encode()
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "little") + rel + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def recorded_digest(module: Path) -> str | None:
    """The source digest a built module carries (None if it was built without one: outside
    setup.py, or before the digest existed)."""
    found = re.search(re.escape(MARKER) + rb"([0-9a-f]{64})", Path(module).read_bytes())
    return found.group(1).decode() if found else None


def native_module(package: Path) -> Path | None:
    """The file `import lmcache_adp._native` loads from the package directory `package`: the first
    _native<suffix> there, in the order the import system tries this interpreter's extension suffixes
    (importlib.machinery.EXTENSION_SUFFIXES: its own ABI tag, .abi3.so, .so); None if there is none. A
    module left for another interpreter (_native.cpython-310-...so) is never it."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (Path(package) / f"_native{suffix}").is_file():
            return Path(package) / f"_native{suffix}"
    return None
