# SPDX-License-Identifier: Apache-2.0
"""Checks that a C++ change is a pure move: the top-level items of the files before (git REV:PATH or
paths) and after (paths) are the same multiset, text unchanged.

An item is a definition or declaration at namespace level with the comment lines before it, from its
first line to the column-0 line that ends it (ending in ';' or '}'). Not items: include lines,
#pragma once, namespace open/close lines, `using proto::Clock;`, each file's head comment. A leading
`inline ` (a definition moved into a header) is ignored.

    python scripts/check_move.py --before HEAD~1:src_cpp/gateway/client_handler.cc \\
        --after src_cpp/gateway/client_handler.cc src_cpp/gateway/process_load.cc ...
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
from pathlib import Path

SKIP = re.compile(r"^(#include|#pragma once|namespace \w+ \{|namespace \{|\}  // namespace|using proto::Clock;)")


def read(spec: str) -> str:
    if Path(spec).is_file():
        return Path(spec).read_text()
    return subprocess.run(["git", "show", spec], check=True, capture_output=True, text=True).stdout


def items(text: str) -> collections.Counter:
    lines = text.split("\n")
    i = 0
    while i < len(lines) and lines[i].startswith("//"):  # the file's head comment
        i += 1
    out: collections.Counter = collections.Counter()
    cur: list[str] = []
    for line in lines[i:]:
        if SKIP.match(line) or (not cur and not line.strip()):
            continue
        line = line.removeprefix("inline ")
        cur.append(line)
        if line and not line[0].isspace() and not line.startswith("//") and line.endswith((";", "}")):
            out["\n".join(cur)] += 1
            cur = []
    if any(c.strip() for c in cur):
        raise SystemExit(f"unterminated item: {cur[:3]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    a = ap.parse_args()
    before = sum((items(read(s)) for s in a.before), collections.Counter())
    after = sum((items(read(s)) for s in a.after), collections.Counter())
    print(f"items before: {before.total()}, after: {after.total()}")
    for name, diff in (("only before", before - after), ("only after", after - before)):
        for item in diff:
            print(f"{name}:\n{item[:800]}\n---")
    same = before == after
    print("the same items" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
