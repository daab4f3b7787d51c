# SPDX-License-Identifier: Apache-2.0
"""`lmcache-adp`: the operator's command line. Each subcommand lives in the
module that owns it and registers itself here."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from lmcache_adp import gateway, ops
from lmcache_adp._version import __version__
from lmcache_adp.native_check import check_native


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
    if why := check_native():  # a developer's build left from other sources: one line, not pybind's TypeError
        print(f"lmcache-adp: error: {why}", file=sys.stderr)
        return ops.EXIT_ERROR
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # `lmcache-adp status ... | head -3`: the reader left early. Exit as a program killed by SIGPIPE
        # would (128 + 13), with no traceback (audit 12); stdout goes to /dev/null so that Python's own
        # flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
