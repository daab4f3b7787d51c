# SPDX-License-Identifier: Apache-2.0
"""External tools the benchmarks measure against, found or refused with how to get them."""

from __future__ import annotations

import shutil

INSTALL_HINTS = {"fio": "apt-get update && apt-get install -y fio"}


def require_tool(name: str) -> str:
    """Path of `name` on PATH; otherwise stop the benchmark saying how to install it."""
    path = shutil.which(name)
    if path is None:
        hint = INSTALL_HINTS.get(name, f"install {name}")
        raise SystemExit(f"{name} is needed to measure the medium's limit and is not installed: {hint}")
    return path


def emit_table(lines: list[str], output: str | None) -> None:
    """Prints a results table, and writes it to `output` too when one is given."""
    table = "\n".join(lines)
    print(table)
    if output:
        with open(output, "w") as f:
            f.write(table + "\n")
