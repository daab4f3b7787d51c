#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Longer fuzzing of the gateway protocol than the test suite's two seconds.

    python scripts/fuzz_protocol.py --seconds 600 [--seed N]

Phase 1 feeds mutated frames to the C++ frame parser in-process; phase 2
starts a gateway on a scratch card and sends mutated frames to it, then
checks that it still serves a real connector. Exit code 0 when both hold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lmcache_adp import ADPConnector  # noqa: E402
from tests.gateway import fuzz  # noqa: E402
from tests.helpers import RawConnector  # noqa: E402
from tests.support.gateway import Gateway  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120, help="total time, split between the two phases")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    accepted, refused = fuzz.run_parser(args.seconds / 2, args.seed)
    print(f"parser: {accepted + refused} frames, {accepted} accepted, {refused} refused, no crash")

    workdir = tempfile.mkdtemp(prefix="adpfuzz-", dir="/tmp")
    gw = Gateway(workdir).start()
    try:
        sent = fuzz.run_network(gw.socket, args.seconds / 2, args.seed)
        c = RawConnector(ADPConnector(gateway=gw.unix_url))
        ok = c.set(["after-fuzz"], [memoryview(b"ok")])[0] and gw.proc.poll() is None
        c.conn.close()
        print(f"gateway: {sent} hostile connections, still serving: {ok}")
        return 0 if ok and gw.stop() == 0 else 1
    finally:
        if gw.proc:
            gw.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
