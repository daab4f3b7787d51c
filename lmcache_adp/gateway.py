# SPDX-License-Identifier: Apache-2.0
"""`lmcache-adp gateway`: the storage gateway daemon, in the foreground.

It owns one card and serves every LMCache server on the host through a Unix
socket (payload through shared-memory rings) and optionally TCP (payload
inline, token required). The serving loop runs in C++ without the GIL; this
module parses arguments, waits for SIGTERM/SIGINT and stops it: batches in
flight finish, the card's open regions are sealed, the socket is removed and
the process exits 0.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket

from lmcache_adp import _native
from lmcache_adp.config import (
    GIB,
    MAX_SOCKET_PATH_BYTES,
    ConfigError,
    card_size_ignored,
    card_size_ok,
    card_size_range,
    read_token_file,
    remove_new_image,
    tcp_address_error,
)
from lmcache_adp.log import get_logger
from lmcache_adp.metrics import MetricsServer
from lmcache_adp.stats_catalog import GATEWAY

log = get_logger()

DEFAULT_SOCKET = "/run/lmcache-adp/gateway.sock"
# `lmcache-adp gateway --help`: the operator's words (the module docstring above is the developer's).
DESCRIPTION = """Run the storage gateway in the foreground.

It owns one card and serves every LMCache server on the host through a Unix
socket (payload through shared-memory rings, or straight into the servers'
memory) and optionally TCP (payload inline, token required). SIGTERM or
SIGINT stops it: batches in flight finish, the card's open regions are
sealed, the socket is removed and it exits 0. Clients refused by a limit
are told why (README, "Gateway limits")."""
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
MISSING_CARD_HINT = (
    "; give --card-size-gb N to create an image file of N GiB there, or `lmcache-adp format --card PATH "
    "--size-gb N` first (a block device must exist)"
)

# flag, default, meaning: every connection, ring and wait of the gateway is
# bounded (issue 9). The ranges are checked in run().
LIMITS = [
    (
        "--max-clients",
        256,
        "local (Unix socket) clients; TCP peers never take these slots, nor do status queries (2 local "
        "connections past it are kept for `lmcache-adp status --gateway`)",
    ),
    ("--max-tcp-clients", 64, "authenticated TCP connections (2 more for status queries, protocol r15)"),
    ("--max-handshakes", 16, "TCP connections not yet authenticated; more are refused at accept"),
    ("--handshake-timeout-ms", 2000, "time a new connection has to complete its Hello"),
    ("--idle-timeout-s", 600, "a connection with no request begun for this long is closed (0: never)"),
    ("--max-ring-mb", 1024, "largest shared-memory ring one connection may map (a client's ring_mb)"),
    ("--max-ring-total-mb", 32768, "shared-memory rings of all connections together"),
    (
        "--max-store-buffer-mb",
        256,
        "one connection's buffer for stores read from its client's memory (protocol r5); a larger object is refused",
    ),
    (
        "--max-store-buffer-total-mb",
        4096,
        "the store buffers of all connections together; a chunk waits for room until its deadline, then fails Busy "
        "(and, apart from them, the buffers connections keep of disk-card process loads)",
    ),
    (
        "--max-segment-total-gb",
        32768,
        "client segments (LMCache's --shm-name L1 files, protocol r3) mapped together: address space, each one its "
        "file's whole size; a registration past it is refused for now (its buffers use the ring, registered again "
        "later)",
    ),
    (
        "--max-request-timeout-s",
        3600,
        "a request's deadline (its timeout_ms) at most; a longer one is held to it, with a warning",
    ),
]
LIMIT_RANGES = {
    "max_clients": (1, 65536),
    "max_tcp_clients": (0, 65536),
    "max_handshakes": (1, 4096),
    "handshake_timeout_ms": (100, 600000),
    "idle_timeout_s": (0, 86400 * 7),
    "max_ring_mb": (1, 4096),
    "max_ring_total_mb": (1, 1 << 30),
    "max_store_buffer_mb": (1, 1 << 20),
    "max_store_buffer_total_mb": (1, 1 << 30),
    "max_segment_total_gb": (1, 1 << 17),
    "max_request_timeout_s": (1, 86400),
}


def native_ranges() -> dict[str, tuple[int, int]]:
    """GatewayServer's own ranges (_native.GATEWAY_OPTION_RANGES: src_cpp/gateway/gateway_server.h's
    kGatewayOptionRanges), option name -> (min, max): the flags of the same names (--io-contexts for io_contexts)
    are checked against these in run() and state them in --help, so that a bound changed there moves the CLI too
    (py35: 64, 1024 and 10000 were copied here). Read when asked, not at import. getattr: a module built before
    them (stale) still gets main()'s one line from check_native, not an AttributeError while the parser is built;
    its GatewayServer checks the same ranges itself."""
    return getattr(_native, "GATEWAY_OPTION_RANGES", {})


def range_help(name: str, form: str = "{lo} to {hi}; ") -> str:
    """GatewayServer's range of option `name` in `form` ('1 to 64; ') for its flag's --help, or ''."""
    lo, hi = native_ranges().get(name, (None, None))
    return "" if lo is None else form.format(lo=lo, hi=hi)


def native_range_error(args: argparse.Namespace) -> str | None:
    """The line run() refuses with (exit 2) for the first flag outside GatewayServer's range, or None."""
    for name, (lo, hi) in native_ranges().items():
        if not lo <= (value := getattr(args, name)) <= hi:
            return f"--{name.replace('_', '-')} must be in [{lo}, {hi}], got {value}"
    return None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gateway",
        help="run the storage gateway daemon (foreground)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--card", required=True, help="block device or card image file")
    p.add_argument(
        "--card-size-gb",
        type=float,
        default=0,
        help="create the image file with this size (GiB; sparse, unless --card-preallocate) if it does not exist; "
        "ignored for an existing card (default 0: the card must exist)",
    )
    p.add_argument(
        "--card-preallocate",
        action="store_true",
        help="with --card-size-gb: a new image file's blocks are allocated when it is created (fallocate; not on "
        "tmpfs), so its filesystem cannot run out under it later, instead of sparse (allocated as the first stores "
        "write them); an existing image is left as it is",
    )
    p.add_argument("--socket", default=DEFAULT_SOCKET, help=f"Unix socket to serve on (default {DEFAULT_SOCKET})")
    p.add_argument(
        "--listen", default="", metavar="tcp://HOST:PORT", help="also serve TCP clients (needs --token-file)"
    )
    p.add_argument("--token-file", help="file holding the token TCP clients must present (with --listen)")
    p.add_argument(
        "--io-contexts",
        type=int,
        default=4,
        help=f"card operations (loads and stores) run in parallel ({range_help('io_contexts')}default 4)",
    )
    p.add_argument(
        "--process-write-threads",
        type=int,
        default=-1,
        help="helper threads that write the pieces of loads into clients' process memory (and read the pieces of "
        "stores from it) beside the connections' threads, where CPUs are spare (default -1: one per CPU the "
        "gateway may use, its container's CPU quota counted; 0: none"
        f"{range_help('process_write_threads', '; {lo} to {hi}')})",
    )
    p.add_argument(
        "--request-spin-us",
        type=int,
        default=0,
        help="after answering a store or load, a connection looks for the client's next request this long before "
        "it sleeps, while every connection leaves a CPU spare beside its own and its client's (connections x 2 <= "
        "CPUs, a container's CPU quota counted) and the machine runs at most half as many threads as CPUs (/proc/loadavg): no wake-up in that "
        f"request's round trip ({range_help('request_spin_us')}default 0: never; the 16-core VM's round trip fell 8 of "
        "~75 us with 100)",
    )
    p.add_argument(
        "--segment-prefault",
        choices=("on", "off"),
        default="on",
        help="populate the gateway's page tables for each registered client segment (LMCache's L1 pool with "
        "--shm-name) in the background, over the pages its file already holds, so that the first loads into them "
        "need not: it costs page tables (~2 MiB a GiB of segment) and one thread's CPU while it runs (~110 ms a "
        "GiB on a 2-CPU VM), once per segment; only segments on tmpfs or hugetlbfs, a disk-backed file's pages "
        "are left to its loads (default on; off: each load populates its own pages)",
    )
    p.add_argument(
        "--max-pipelined-stores",
        type=int,
        default=-1,
        help="large process stores read and copied into the card at once (each may hold an I/O context for up to "
        "200 ms plus its bytes at 512 MiB/s); the rest go through the store buffer (default -1: half of "
        "--io-contexts, rounded down, so none with one context; 0: none"
        f"{range_help('max_pipelined_stores', '; {lo} to {hi}')})",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus /metrics, /health and /stats on this port (default: off)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics endpoint binds (default 127.0.0.1; it has no authentication)",
    )
    lim = p.add_argument_group("limits (README, 'Gateway limits')")
    for flag, default, what in LIMITS:
        lim.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    p.set_defaults(func=run)


def tcp_port_taken(listen: str) -> str | None:
    """Why --listen's port (a checked tcp://HOST:PORT) cannot be bound now because another process holds it, or
    None. Tried as the C++ listener binds it (proto::listen_endpoint: getaddrinfo's first address, SO_REUSEADDR,
    so a former gateway's connections in TIME_WAIT do not count), then let go for it. Only a port in use is
    refused here: any other failure (a host that does not resolve, an address not this host's) is the
    listener's to name, as before."""
    host, _, port = listen[len("tcp://") :].rpartition(":")
    if int(port) == 0:
        return None  # any free port
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
    except OSError:
        return None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return (
                    f"{e.strerror} (another process holds the port: another gateway's --listen, or another server; "
                    "give each its own)"
                )
    return None


def run(args: argparse.Namespace) -> int:
    if args.card_size_gb != 0 and not card_size_ok(args.card_size_gb):
        log.error(
            "--card-size-gb must be 0 (the card must exist) or a number of GiB in %s, got %g",
            card_size_range(),
            args.card_size_gb,
        )
        return 2
    if len(os.path.abspath(args.socket).encode()) > MAX_SOCKET_PATH_BYTES:  # before the card is opened
        log.error(
            "--socket %s is %d bytes: a Unix socket path is at most %d",
            os.path.abspath(args.socket),
            len(os.path.abspath(args.socket).encode()),
            MAX_SOCKET_PATH_BYTES,
        )
        return 2
    if args.listen and not args.token_file:
        log.error("--listen needs --token-file: TCP clients must present a token")
        return 2
    # Before the card is opened (it was the native parser's "port must be 0-65535" for 'tcp://h:9500/', after it);
    # port 0 listens on a free port, which the ready line names.
    if args.listen and (
        why := tcp_address_error(args.listen, 0) if args.listen.startswith("tcp://") else "expected tcp://HOST:PORT"
    ):
        log.error("--listen %s: %s", args.listen, why)
        return 2
    if args.token_file and not args.listen:
        # It was ignored without a word: an operator who forgot --listen got a gateway no TCP client reaches.
        log.warning("--token-file %s is ignored without --listen: this gateway serves no TCP clients", args.token_file)
    if why := native_range_error(args):
        log.error("%s", why)
        return 2
    if args.max_pipelined_stores >= args.io_contexts:
        log.warning(
            "--max-pipelined-stores %d >= --io-contexts %d: clients whose memory is slow can then hold every I/O "
            "context (each for up to 200 ms plus its object's bytes at 512 MiB/s); keep it below the contexts "
            "unless every client is trusted",
            args.max_pipelined_stores,
            args.io_contexts,
        )
    if not 0 <= args.metrics_port <= 65535:
        log.error("--metrics-port must be in [0, 65535], got %d", args.metrics_port)
        return 2
    for name, (lo, hi) in LIMIT_RANGES.items():
        if not lo <= getattr(args, name) <= hi:
            log.error("--%s must be in [%d, %d], got %d", name.replace("_", "-"), lo, hi, getattr(args, name))
            return 2
    try:
        token = read_token_file(args.token_file, "--token-file") if args.listen else ""
    except ConfigError as e:
        log.error("%s", e)
        return 2
    # The ports before the card (review33c C3): a port another process holds was found only after the card was
    # opened and recovered, a whole recovery walk on a large card for one line of refusal. The metrics port is
    # bound here and served once the card is open (a scrape meanwhile waits in its backlog); the TCP port is
    # tried (the C++ listener binds it after the card's lock, which tells a second gateway on the card to go
    # away first), so a port taken is refused before anything is opened.
    metrics = None
    if args.metrics_port:
        try:
            metrics = MetricsServer(
                lambda: {**json.loads(server.stats_json()), "card": card},
                args.metrics_port,
                source=GATEWAY,
                host=args.metrics_host,
                start=False,
            )
        except OSError as e:
            # The flags named, as the connector's message names adapter_params (audit 15: "metrics on H:P: ...").
            log.error(
                "gateway not started: --metrics-port %d on --metrics-host %s: cannot serve metrics there: %s%s",
                args.metrics_port,
                args.metrics_host,
                e.strerror or e,
                " (another process holds the port: another gateway's --metrics-port or a connector's metrics_port; "
                "give each its own)"
                if e.errno == errno.EADDRINUSE
                else "",
            )
            return 1
    if args.listen and (taken := tcp_port_taken(args.listen)):
        log.error("gateway not started: --listen %s: cannot listen there: %s", args.listen, taken)
        if metrics is not None:
            metrics.close()
        return 1
    socket_dir = os.path.dirname(os.path.abspath(args.socket))
    try:
        # Made where missing (a packaged unit relies on it: /run/lmcache-adp), and said, so that a typo in the
        # path (as root: /nonexistent/dir) is a line in the log, not a gateway on a socket nobody looks for
        # (review33c).
        if not os.path.isdir(socket_dir):
            os.makedirs(socket_dir)
            log.info("created the socket directory %s (it did not exist)", socket_dir)
    except OSError as e:
        if not os.path.isdir(socket_dir):  # else made meanwhile by another process (a second gateway's start)
            log.error("cannot create the socket directory %s: %s", socket_dir, e.strerror)
            if metrics is not None:
                metrics.close()
            return 1

    # Block the stop signals before the C++ threads start (they inherit the
    # mask), so they reach this thread's sigwait and nothing else.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    card = os.path.abspath(args.card)
    card_existed = os.path.lexists(card)  # before this start: its image is not this start's to remove
    try:
        server = _native.GatewayServer(
            card=card,
            card_size_bytes=int(args.card_size_gb * GIB),
            card_preallocate=args.card_preallocate,
            socket_path=os.path.abspath(args.socket),
            listen=args.listen,
            token=token,
            io_contexts=args.io_contexts,
            process_write_threads=args.process_write_threads,
            max_pipelined_stores=args.max_pipelined_stores,
            request_spin_us=args.request_spin_us,
            segment_prefault=args.segment_prefault == "on",
            max_clients=args.max_clients,
            max_tcp_clients=args.max_tcp_clients,
            max_handshakes=args.max_handshakes,
            handshake_timeout_ms=args.handshake_timeout_ms,
            idle_timeout_ms=args.idle_timeout_s * 1000,
            max_ring_bytes=args.max_ring_mb << 20,
            max_ring_total_bytes=args.max_ring_total_mb << 20,
            max_store_buffer_bytes=args.max_store_buffer_mb << 20,
            max_store_buffer_total_bytes=args.max_store_buffer_total_mb << 20,
            max_request_timeout_ms=args.max_request_timeout_s * 1000,
            max_segment_total_bytes=args.max_segment_total_gb << 30,
        )
    except (RuntimeError, ValueError) as e:
        # A missing image and no size (README's own line names a block device, which has no size): say how to
        # make one, where the message ended at "does not exist" (audit 14).
        hint = MISSING_CARD_HINT if not card_existed and not args.card_size_gb and "does not exist" in str(e) else ""
        log.error("gateway not started: %s%s", e, hint)
        if not card_existed:
            remove_new_image(card, log, str(e))
        if metrics is not None:
            metrics.close()
        return 1
    if card_existed and args.card_size_gb and (note := card_size_ignored(card, args.card_size_gb, "--card-size-gb")):
        log.warning("%s", note)
    if warning := _native.card_space_warning(card):
        log.warning("%s", warning)
    if metrics is not None:
        metrics.start()
    where = f"unix://{os.path.abspath(args.socket)}"
    if args.listen:
        where += f" and tcp port {server.tcp_port}"
    log.info("gateway ready (pid %d) on %s", os.getpid(), where)

    while True:
        sig = signal.sigtimedwait(STOP_SIGNALS, 1.0)
        # CPython returns a struct_siginfo holding garbage (si_signo 0 or
        # anything) when the wait was interrupted (EINTR: SIGSTOP then
        # SIGCONT) and its timeout ran out meanwhile: only a stop signal stops.
        if sig is not None and sig.si_signo in STOP_SIGNALS:
            log.info("%s received: stopping", signal.Signals(sig.si_signo).name)
            break
        if server.wait(0):
            log.error("gateway loop ended on its own")
            if metrics is not None:
                metrics.close()  # before the server goes: its thread asks the server for stats
            server.close()
            return 1
    if metrics is not None:
        metrics.close()
    server.stop()
    server.close()
    log.info("gateway stopped")
    return 0
