# SPDX-License-Identifier: Apache-2.0
"""The Python binding (src_cpp/python/bindings.cc) and the frame fuzzer under a sanitizer.

Run by `scripts/sanitize.sh asan-python`, with lmcache_adp's _native built
with AddressSanitizer + UBSan and preloaded libasan; a gateway it starts runs
the same sanitized build. Not a pytest module: it is a program that exits 0
when every step held and non-zero (or is aborted by the sanitizer) otherwise.

    python tests/sanitizers/bindings_driver.py WORKDIR [FRAMES]

FRAMES (default 20000) mutated frames go to the parser in-process; a tenth as
many hostile connections go to a live gateway, which must go on serving.
"""

from __future__ import annotations

import os
import sys

# lmcache_adp first, from PYTHONPATH (the sanitized build); then the tree, for tests.*
from lmcache_adp import ADPConnector, CardStore, _native, crc32c, format_card  # noqa: I001

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.gateway import fuzz  # noqa: E402
from tests.helpers import RawConnector, payload  # noqa: E402
from tests.support.gateway import Gateway  # noqa: E402


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"bindings_driver: FAILED: {what}")


def exercise_connector(c: RawConnector, tag: str) -> None:
    keys = [f"{tag}/{i}" for i in range(16)]
    sizes = [1, 4095, 4096, 4097, 200_000] * 3 + [1000_000]
    datas = [payload(k, n) for k, n in zip(keys, sizes, strict=True)]
    ok, err, _ = c.set(keys, [memoryview(d) for d in datas])
    check(ok, f"{tag}: set failed: {err}")
    check(c.exists(keys + ["absent"])[2] == [True] * 16 + [False], f"{tag}: exists")
    outs = [bytearray(len(d)) for d in datas]
    ok, err, hits = c.get(keys, [memoryview(o) for o in outs])
    check(ok and all(hits) and [bytes(o) for o in outs] == datas, f"{tag}: get: {err}")
    check(c.delete(keys[:4])[2] == [True] * 4, f"{tag}: delete")
    check(c.exists(keys[:5])[2] == [False] * 4 + [True], f"{tag}: exists after delete")
    st = c.conn.stats()
    check(isinstance(st, dict) and c.conn.describe(), f"{tag}: stats/describe")


def main() -> int:
    workdir = sys.argv[1]
    frames = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    check(_native.__file__.startswith(os.environ.get("ADP_SANITIZED_PREFIX", "/nonexistent")), _native.__file__)
    # The build records its sources' digest as setup.py's does, so native_build() judges it by content.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    import tools

    build = tools.native_build()
    check(build["sanitizer"] == "asan-python" and build["stale"] == [], tools.describe_build(build))

    accepted, refused = fuzz.run_parser(frames=frames)
    check(accepted + refused == frames and refused > 0 and accepted > 0, "parser fuzz")
    print(f"bindings_driver: parser: {frames} frames ({accepted} accepted, {refused} refused)", flush=True)

    check(crc32c(b"123456789") == 0xE3069283 and crc32c(b"6789", crc32c(b"12345")) == 0xE3069283, "crc32c")
    card = os.path.join(workdir, "store.img")
    s = CardStore(card, 32 << 20)
    for i, n in enumerate([0, 1, 4095, 4096, 4097, 300_000]):
        s.put(f"s{i}", payload(f"s{i}", n))
    check(all(s.get(f"s{i}") == payload(f"s{i}", n) for i, n in enumerate([0, 1, 4095, 4096, 4097, 300_000])), "get")
    check(s.exists("s1") and s.remove("s1") and not s.exists("s1") and s.get("s1") is None, "remove")
    check(s.verify()["bad_objects"] == [], "verify")
    check(s.stats()["objects"] == 5, "stats")
    s.close()
    format_card(card)

    embedded = RawConnector(ADPConnector(card=os.path.join(workdir, "embedded.img"), card_size_gb=0.0625))
    exercise_connector(embedded, "embedded")
    embedded.conn.close()

    gw = Gateway(workdir, tcp=True, card_size_gb=0.0625).start()
    try:
        sent = fuzz.run_network(gw.socket, frames=max(1, frames // 10))
        print(f"bindings_driver: gateway: {sent} hostile connections", flush=True)
        check(gw.proc.poll() is None, "the gateway died under the fuzzer:\n" + gw.log())
        unix = RawConnector(ADPConnector(gateway=gw.unix_url))
        exercise_connector(unix, "unix")
        unix.conn.close()
        tcp = RawConnector(ADPConnector(gateway=gw.tcp_url, token_file=gw.token_file))
        exercise_connector(tcp, "tcp")
        tcp.conn.close()
        rc = gw.stop()
        check(rc == 0, f"the gateway exited {rc}")
    except BaseException:
        if gw.proc:
            gw.kill()
        print("bindings_driver: the gateway's log:\n" + gw.all_logs()[-30000:], file=sys.stderr, flush=True)
        raise
    print("bindings_driver: PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
