# SPDX-License-Identifier: Apache-2.0
"""`lmcache-adp`: the operator's command line. Each subcommand lives in the
module that owns it and registers itself here."""

from __future__ import annotations

import argparse
import sys

from lmcache_adp import gateway, ops
from lmcache_adp._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmcache-adp",
        description="ADP card as the L2 tier of the LMCache MP server: gateway daemon and operations",
    )
    parser.add_argument("--version", action="version", version=f"lmcache-adp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gateway.register(sub)
    ops.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
