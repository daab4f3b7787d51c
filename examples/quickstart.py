#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Quick start: the ADP card as the L2 tier of a real LMCache MP server.

Starts `lmcache server --l1-size-gb 1 --eviction-policy LRU --l2-adapter <ADP>`
with an embedded card image in a work directory, then plays vLLM's part with the
same client classes vLLM's LMCacheMPConnector uses (on CPU tensors, no GPU):

  1. store a prompt's KV (LMCache writes it to L1, then to the card);
  2. drop it from LMCache's CPU tier (POST /cache/clear);
  3. look the prompt up and retrieve it: every token must hit, the bytes must
     be the stored ones, and the server must report that they came from L2;
  4. with --restart: stop the server, start a new one on the same card and
     retrieve the prompt again (the engine restarts, the cache stays).

The server is stopped by its PID. Exit code 0 only if every check held.

    python examples/quickstart.py                 # temporary directory, removed after
    python examples/quickstart.py --workdir DIR   # card image and server log kept in DIR
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

# Client-side LMCache chatter off (the server keeps its own log in the work directory).
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

from lmcache_adp.config import card_size_ok, card_size_range  # noqa: E402 (after the environment is set)
from lmcache_adp.testing import (  # noqa: E402 (after the environment is set)
    KVShape,
    MPServer,
    ServerError,
    VLLMClient,
    adp_adapter,
    drop_l1,
    restore_prompt,
    store_prompt,
)

MIB = 1 << 20
CHUNK_TOKENS = 256  # MPServer's chunk_size (lmcache server --chunk-size)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", help="where the card image and the server log go (default: a temporary directory)")
    p.add_argument("--card-size-gb", type=float, default=4.0, help="size of the (sparse) card image in GiB (default 4)")
    p.add_argument("--tokens", type=int, default=1024, help="prompt length, a multiple of 256 (default 1024)")
    p.add_argument("--layers", type=int, default=32, help="KV shape: layers (default 32, Llama-8B)")
    p.add_argument("--kv-heads", type=int, default=8, help="KV shape: KV heads (default 8)")
    p.add_argument("--head-dim", type=int, default=128, help="KV shape: head dim (default 128)")
    p.add_argument("--restart", action="store_true", help="also restart the server and retrieve from the card again")
    args = p.parse_args(argv)
    # Checked before the server starts (it was a ValueError traceback after it had, audit 12).
    if args.tokens <= 0 or args.tokens % CHUNK_TOKENS:
        p.error(f"--tokens must be a positive multiple of {CHUNK_TOKENS} (LMCache's chunk), got {args.tokens}")
    if not card_size_ok(args.card_size_gb):
        p.error(f"--card-size-gb must be a number of GiB in {card_size_range()}, got {args.card_size_gb:g}")
    for name in ("layers", "kv_heads", "head_dim"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def check(results: list[tuple[str, bool]], what: str, ok: bool) -> bool:
    results.append((what, ok))
    print(f"  [{'ok' if ok else 'FAILED'}] {what}")
    return ok


def report_restore(results: list, label: str, r) -> None:
    where = f"the server loaded {r.l2_loaded_chunks:.0f} of {r.hit_chunks} chunks from L2"
    print(f"  {label}: {r.hit_tokens}/{r.tokens} tokens hit ({where}); "
          f"lookup {r.lookup_s * 1e3:.1f} ms, retrieve {r.retrieve_s * 1e3:.1f} ms")  # fmt: skip
    check(results, f"{label}: every token hits", r.hit_tokens == r.tokens)
    check(results, f"{label}: retrieve succeeded and the bytes are identical", r.retrieved and r.identical)
    check(results, f"{label}: the server reports it came from L2 (the card)", r.from_l2)


def run(args: argparse.Namespace, workdir: Path) -> bool:
    card = workdir / "card.img"
    adapter = adp_adapter(card=str(card), card_size_gb=args.card_size_gb)
    shape = KVShape(
        num_layers=args.layers, num_heads=args.kv_heads, head_dim=args.head_dim,
        num_blocks=2 * -(-args.tokens // 16) + 1,
    )  # fmt: skip
    results: list[tuple[str, bool]] = []
    print(f"lmcache-adp quick start (work directory {workdir})")
    print(f"  prompt: {args.tokens} tokens x {shape.bytes_per_token // 1024} KiB/token "
          f"= {args.tokens * shape.bytes_per_token / MIB:.0f} MiB of KV")  # fmt: skip

    server = MPServer([adapter], workdir, l1_size_gb=1)
    t0 = time.monotonic()
    server.start()
    print(f"  lmcache server pid {server.pid} on {server.url} (HTTP {server.http_url}), "
          f"card {card}: up in {time.monotonic() - t0:.1f} s")  # fmt: skip
    try:
        with VLLMClient(server.url, shape) as client:
            stored = store_prompt(server, client, args.tokens)
            print(f"  stored: STORE acknowledged in {stored.store_s * 1e3:.0f} ms, "
                  f"on the card {stored.l2_write_s * 1e3:.0f} ms after it was sent")  # fmt: skip
            check(results, "L1 is empty after POST /cache/clear", drop_l1(server) == 0)
            report_restore(results, "restore after clearing L1", restore_prompt(server, client, stored))
    finally:
        code = server.stop()
        print(f"  server pid {server.pid} stopped (exit {code})")

    if args.restart:
        server = MPServer([adapter], workdir, l1_size_gb=1, name="server-restarted")
        server.start()
        print(f"  new lmcache server pid {server.pid} on the same card")
        try:
            with VLLMClient(server.url, shape) as client:
                report_restore(results, "restore after a server restart", restore_prompt(server, client, stored))
        finally:
            code = server.stop()
            print(f"  server pid {server.pid} stopped (exit {code})")

    passed = all(ok for _, ok in results)
    print(f"{'PASS' if passed else 'FAIL'}: {sum(ok for _, ok in results)}/{len(results)} checks; "
          f"server logs {'in ' + str(workdir) if args.workdir else 'removed with the temporary directory'}")  # fmt: skip
    return passed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import lmcache  # noqa: F401
    except ImportError:
        print("FAIL: LMCache is not installed: pip install 'lmcache-adp[lmcache]'", file=sys.stderr)
        return 1
    if args.workdir:
        workdir = Path(args.workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="lmcache-adp-quickstart-"))
    try:
        return 0 if run(args, workdir) else 1
    except (ServerError, TimeoutError, OSError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
