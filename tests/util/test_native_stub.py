# SPDX-License-Identifier: Apache-2.0
"""lmcache_adp/_native.pyi describes the built module: the same public names,
the same methods per class, and a docstring on each (issue 11, item 7)."""

from __future__ import annotations

import ast
from pathlib import Path

from lmcache_adp import _native

STUB = Path(_native.__file__).with_name("_native.pyi")
if not STUB.exists():  # an editable or in-place build: the stub is in the source tree
    STUB = Path(__file__).resolve().parents[2] / "lmcache_adp" / "_native.pyi"


def stub_names() -> tuple[set[str], dict[str, set[str]], list[str]]:
    """(module-level names, methods per class, names without a docstring)."""
    tree = ast.parse(STUB.read_text())
    names, classes, undocumented = set(), {}, []
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
            if not ast.get_docstring(node):
                undocumented.append(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            classes[node.name] = set()
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    classes[node.name].add(f.name)
                    if not ast.get_docstring(f):
                        undocumented.append(f"{node.name}.{f.name}")
    return names, classes, undocumented


def public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stub_names_match_the_module():
    names, classes, _ = stub_names()
    assert names == public(_native), f"stub only: {names - public(_native)}; module only: {public(_native) - names}"
    for cls, methods in classes.items():
        built = public(getattr(_native, cls)) | {"__init__"}
        assert methods == built, f"{cls}: stub only {methods - built}; module only {built - methods}"


def test_every_stub_function_has_a_docstring():
    assert stub_names()[2] == []


def test_every_bound_function_has_a_docstring():
    """help() on the module shows what each bound function does, not only its signature."""
    missing = []
    for name in public(_native):
        obj = getattr(_native, name)
        if isinstance(obj, type):
            for m in public(obj) | {"__init__"}:
                doc = getattr(obj, m).__doc__ or ""
                if "\n" not in doc.strip() and not isinstance(getattr(obj, m), property):
                    missing.append(f"{name}.{m}")
        elif callable(obj) and "\n" not in (obj.__doc__ or "").strip():
            missing.append(name)
    assert missing == []
