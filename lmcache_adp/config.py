# SPDX-License-Identifier: Apache-2.0
"""adapter_params of ADPConnector: defaults, validation and clear errors.

Everything is checked here, before any thread, file or socket is created, so a
bad LMCache config fails with one message naming the parameter and what it
accepts.
"""

from __future__ import annotations

import difflib
import fcntl
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmcache_adp import _native

GIB = 1024**3
MIB = 1024**2
DEFAULT_RING_MB = 64
# The protocol's bounds come from the binding (src_cpp/protocol/frame.h).
MAX_TOKEN_BYTES = _native.MAX_TOKEN_BYTES
MIN_RING_MB, MAX_RING_MB = _native.MIN_RING_BYTES // MIB, _native.MAX_RING_BYTES // MIB
# The smallest gateway_stall_s taken: the gateway shows it works every 100 ms at most (docs/protocol.md r7, r8),
# so a bound near that reads a working gateway stalled between its signs of life (review r10 N8).
MIN_GATEWAY_STALL_S = 0.5
# A connect's bound, its handshake included (adapter_params connect_timeout_ms, `status --connect-timeout-ms`), in
# ms: 2000 by default (src_cpp/transport/gateway_client.h kDefaultConnectTimeout). At least 100: a gateway's handshake
# maps the client's ring and a loaded host delays its threads by tens of ms, so a shorter bound fails connects to a
# working gateway (and the gateway's own --handshake-timeout-ms has the same floor). At most 600000 (10 minutes):
# the connects of an idle connector's background reconnect and status query wait it out one at a time, so a longer
# bound leaves a gateway that accepts and never answers read reachable (/health 200) that long; a slow TCP link or
# a loaded gateway answers in seconds (the gateway's --handshake-timeout-ms has the same ceiling).
DEFAULT_CONNECT_TIMEOUT_MS, MIN_CONNECT_TIMEOUT_MS, MAX_CONNECT_TIMEOUT_MS = 2000, 100, 600_000
# The longest Unix socket path: sizeof(sockaddr_un.sun_path) - 1 on Linux (src_cpp/protocol/socket_io.cc refuses
# a longer one at connect or bind, where it failed every request instead of the start).
MAX_SOCKET_PATH_BYTES = 107
# The sizes a new card image is created with (adapter_params card_size_gb, `gateway --card-size-gb`,
# `format --size-gb`), in GiB: 16 MiB (the store's own floor is 9 MiB: 1 MiB and 8 regions of 1 MiB) to 1 PiB.
# Checked before the file is created, so a refused size leaves no image behind.
MIN_CARD_SIZE_GB, MAX_CARD_SIZE_GB = 1 / 64, 1 << 20


def card_size_ok(size: Any) -> bool:
    """A number of GiB a card image may be created with (NaN, bools and strings are not)."""
    return (
        not isinstance(size, bool) and isinstance(size, (int, float)) and MIN_CARD_SIZE_GB <= size <= MAX_CARD_SIZE_GB
    )


def connect_timeout_error(value: Any) -> str | None:
    """Why `value` is not a connect bound (a whole number of ms in [MIN_CONNECT_TIMEOUT_MS, MAX_CONNECT_TIMEOUT_MS]),
    in words that follow the parameter's or flag's name; None if it is one. The connector's adapter_params and the
    status command's --connect-timeout-ms take the same values."""
    if (
        not isinstance(value, bool)
        and isinstance(value, int)
        and MIN_CONNECT_TIMEOUT_MS <= value <= MAX_CONNECT_TIMEOUT_MS
    ):
        return None
    return (
        f"must be a whole number of milliseconds in [{MIN_CONNECT_TIMEOUT_MS}, {MAX_CONNECT_TIMEOUT_MS}], got "
        f"{value!r} (below {MIN_CONNECT_TIMEOUT_MS} ms a working gateway on a loaded host misses it; above "
        f"{MAX_CONNECT_TIMEOUT_MS // 60_000} minutes a gateway that accepts and never answers reads reachable that long)"
    )


def amount(nbytes: int) -> str:
    """ "1.50 GiB" from 1 GiB up, "48.00 MiB" below, as the card-space WARNING writes them
    (src_cpp/store/card_device.cc): a small image read "0.04 GiB, 0.02 GiB of it written, 0.00 GiB free" (audit 14).
    Here, not in metrics (which imports this module), so that card_size_ignored writes sizes the same way."""
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.2f} MiB"


def card_size_range() -> str:
    return f"[{MIN_CARD_SIZE_GB:g}, {MAX_CARD_SIZE_GB}]"


def card_size_ignored(path: str, size_gb: float, what: str) -> str | None:
    """What to tell the operator when an image file that existed before the open has another size than the
    one asked for (`what`: the parameter or flag that asked): the size applies only when an image is created,
    so the card keeps its own. None when it matches or the path is not a regular file."""
    try:
        if not os.path.isfile(path):
            return None
        have = os.path.getsize(path)
    except OSError:
        return None
    if have == int(size_gb * GIB) & ~4095:
        return None
    return (
        f"{what} {size_gb:g} ignored: card image {path} exists with {amount(have)} and keeps that size (the "
        "size applies when an image is created; to resize, stop, remove the image and start again: its cached "
        "objects are lost)"
    )


def remove_new_image(card: str, log, why: str = "") -> None:
    """Removes the card image a failed start created (it did not exist before that start), so the next start
    creates it anew at the size it is given; `why` is the start's error. Left alone where another process made
    it meanwhile ("created concurrently") or holds it (its lock): then it is that process's card. The gateway
    (`lmcache-adp gateway`) and the embedded ADPConnector follow this one rule."""
    if "created concurrently" in why:
        return
    try:
        fd = os.open(card, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # never made, or gone
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # held: another gateway's or connector's
        os.unlink(card)
        log.info("removed the card image %s this start had created", card)
    except OSError as e:
        log.warning("cannot remove the card image %s this start had created: %s", card, e.strerror)
    finally:
        os.close(fd)


def default_card_path() -> str:
    """The embedded card image when `card` is not given: under the user's cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return os.path.join(base, "lmcache-adp", "card.img")


@dataclass(frozen=True)
class Param:
    default: Any
    meaning: str


# The public adapter_params and their defaults: from_params reads its
# defaults here (README's table states the same).
PARAMS: dict[str, Param] = {
    "gateway": Param(
        "embedded",
        '"embedded" (card store in-process), "unix:///path/gateway.sock" or "tcp://host:port" (a gateway daemon)',
    ),
    "card": Param(None, "embedded mode: card path (block device or image file); default ~/.cache/lmcache-adp/card.img"),
    "card_size_gb": Param(
        16,
        "embedded mode: size of the image file when it is created (sparse; see card_preallocate)",
    ),
    "card_preallocate": Param(
        False,
        "embedded mode: true: a new image file's blocks are allocated when it is created (fallocate; not on tmpfs), "
        "so its filesystem cannot run out under it later; default false: sparse, its blocks allocated as the first "
        "stores write them; an existing image is left as it is",
    ),
    "num_workers": Param(
        None,
        "worker threads of the connector (1-64); default 8 embedded (they check and copy while others wait "
        "on the card), 4 with a gateway (one connection and ring each)",
    ),
    "io_depth": Param(4, "embedded mode: card I/O in flight at once, the card's queue depth (1-256)"),
    "timeout_ms": Param(10000, "deadline of one operation; past it the future completes as failed"),
    "durable": Param(True, "fdatasync before a store is acknowledged (power-loss safety)"),
    "metrics_port": Param(0, "serve Prometheus /metrics, /health and /stats on this port (0: off)"),
    "metrics_host": Param(
        "127.0.0.1",
        "address the metrics endpoint binds (it has no authentication: another address exposes the card's "
        "stats to whoever reaches it)",
    ),
    "token_file": Param(None, "tcp gateway: file holding the shared token (required for tcp://)"),
    "ring_mb": Param(
        DEFAULT_RING_MB,
        f"unix gateway: shared-memory ring per worker connection, MiB ({MIN_RING_MB}-{MAX_RING_MB}); "
        "bounds the largest object",
    ),
    "direct_loads": Param(
        True,
        "unix gateway: buffers in a /dev/shm file (LMCache's L1 with --shm-name) are registered and the "
        "gateway loads straight into them (and, on a memory-speed card, stores from them); false: the ring",
    ),
    "ring_pieces": Param(
        True,
        "unix gateway: a load through the ring from a memory-speed card is copied out piece by piece while the "
        "gateway reads the next piece in (protocol r4); false: copied out once the whole batch is in the ring",
    ),
    "process_memory": Param(
        True,
        "unix gateway: the gateway writes loads straight into this process's memory with process_vm_writev "
        "and reads stores from it with process_vm_readv (protocol r5; needs ptrace permission, same uid and "
        "PID namespace: else the ring, logged once); "
        "false: the ring",
    ),
    "gateway_stall_s": Param(
        5,
        "unix:// or tcp:// gateway: a request waiting this many seconds with nothing heard from the gateway makes "
        "it stalled (stat gateway_stalled, /health 503) until it is heard from again (a number of seconds, at least "
        "0.5, at most 3600)",
    ),
    "connect_timeout_ms": Param(
        DEFAULT_CONNECT_TIMEOUT_MS,
        "unix:// or tcp:// gateway: a connect to the gateway, its handshake included, gives up after this many "
        f"milliseconds ({MIN_CONNECT_TIMEOUT_MS}-{MAX_CONNECT_TIMEOUT_MS}): the start-up connect, a batch's (its "
        "timeout_ms if sooner), the background reconnect's and an idle connector's status query; connects left "
        "unanswered this long are an outage (gateway_reachable 0)",
    ),
    "reply_spin_us": Param(
        200,
        "unix:// or tcp:// gateway: a worker waiting for a store's or load's reply polls the socket without "
        "sleeping for up to this many microseconds from shortly before the reply is expected (learnt from earlier "
        "requests of the same size), while CPUs are idle (connections x 2 and runnable threads x 2 at most the "
        "CPUs: the affinity's, or a container's CPU quota where fewer): no wake-up in its round trip. On by default "
        "(200); 0-10000; 0: never",
    ),
    "ptracer_follow": Param(
        False,
        "unix gateway, Yama ptrace_scope 1: once the gateway named with PR_SET_PTRACER has exited, name the "
        "gateway that answers on the socket path next (a restart); this trusts every process of the uid that can "
        "bind that path. false: one gateway per process, a restarted one gets the ring",
    ),
}

# Keys that only mean something for one kind of gateway.
_EMBEDDED_ONLY = ("card", "card_size_gb", "card_preallocate", "durable", "io_depth")


class ConfigError(ValueError):
    """A bad adapter_params entry; the message names the key and what it accepts."""


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"adapter_params['{name}'] must be an integer in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"adapter_params['{name}'] must be in [{lo}, {hi}], got {value}")
    return value


@dataclass(frozen=True)
class ConnectorConfig:
    gateway: str = "embedded"
    card: str = field(default_factory=default_card_path)
    card_size_gb: float = 16
    card_preallocate: bool = False
    num_workers: int = 8
    io_depth: int = 4
    timeout_ms: int = 10000
    durable: bool = True
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    token: str = field(default="", repr=False)
    ring_mb: int = DEFAULT_RING_MB
    direct_loads: bool = True
    ring_pieces: bool = True
    process_memory: bool = True
    ptracer_follow: bool = False
    gateway_stall_s: float = 5
    reply_spin_us: int = 200
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ConnectorConfig:
        def get(key: str) -> Any:
            return params.get(key, PARAMS[key].default)

        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            # The nearest valid key of each, where one is near: a typo ('card_sizegb') is read at a glance, not
            # found in a list of 17 (audit 14).
            near = [(k, m[0]) for k in unknown if (m := difflib.get_close_matches(str(k), PARAMS, n=1, cutoff=0.8))]
            if len(unknown) == 1:
                meant = f" (did you mean {near[0][1]!r}?)" if near else ""
            else:
                meant = f" (did you mean {', '.join(f'{m!r} for {k!r}' for k, m in near)}?)" if near else ""
            raise ConfigError(
                f"unknown adapter_params key(s) {', '.join(map(repr, unknown))}{meant}; valid keys: {', '.join(PARAMS)}"
            )
        gateway = get("gateway")
        if not isinstance(gateway, str) or not (gateway == "embedded" or gateway.startswith(("unix:///", "tcp://"))):
            raise ConfigError(
                f"adapter_params['gateway'] = {gateway!r} is not supported; valid choices: "
                "'embedded', 'unix:///path/to/gateway.sock', 'tcp://host:port'"
            )
        if gateway.startswith("unix://") and len(gateway[len("unix://") :].encode()) > MAX_SOCKET_PATH_BYTES:
            raise ConfigError(
                f"adapter_params['gateway'] = {gateway!r}: a Unix socket path is at most {MAX_SOCKET_PATH_BYTES} "
                f"bytes, this one is {len(gateway[len('unix://') :].encode())} (start the gateway with a shorter --socket)"
            )
        if gateway.startswith("tcp://") and (why := tcp_address_error(gateway, 1)):
            raise ConfigError(f"adapter_params['gateway'] = {gateway!r}: {why}")
        if gateway != "embedded":
            misplaced = [k for k in _EMBEDDED_ONLY if k in params]
            if misplaced:
                verb = "applies" if len(misplaced) == 1 else "apply"  # review33c C5: "'card' apply to"
                raise ConfigError(
                    f"adapter_params {', '.join(map(repr, misplaced))} {verb} to gateway='embedded' only; "
                    "the gateway daemon owns its card (lmcache-adp gateway --card PATH)"
                )

        def unix_only(key: str) -> Any:
            """The value of `key`, a parameter for a unix:// gateway only: refused when given with another gateway."""
            if key in params and not gateway.startswith("unix://"):
                raise ConfigError(f"adapter_params[{key!r}] applies to a unix:// gateway only")
            return get(key)

        def unix_only_bool(key: str) -> bool:
            value = unix_only(key)
            if not isinstance(value, bool):
                raise ConfigError(f"adapter_params[{key!r}] must be true or false, got {value!r}")
            return value

        ring_mb = _int("ring_mb", unix_only("ring_mb"), MIN_RING_MB, MAX_RING_MB)
        direct_loads = unix_only_bool("direct_loads")
        ring_pieces = unix_only_bool("ring_pieces")
        process_memory = unix_only_bool("process_memory")
        ptracer_follow = unix_only_bool("ptracer_follow")
        if "gateway_stall_s" in params and gateway == "embedded":
            raise ConfigError("adapter_params['gateway_stall_s'] applies to a unix:// or tcp:// gateway only")
        stall = get("gateway_stall_s")
        if isinstance(stall, bool) or not isinstance(stall, (int, float)) or not MIN_GATEWAY_STALL_S <= stall <= 3600:
            raise ConfigError(
                f"adapter_params['gateway_stall_s'] must be a number of seconds, at least {MIN_GATEWAY_STALL_S} "
                f"and at most 3600, got {stall!r} (below {MIN_GATEWAY_STALL_S} s a working gateway reads stalled "
                "between its signs of life, which come every 100 ms at most)"
            )
        if "reply_spin_us" in params and gateway == "embedded":
            raise ConfigError("adapter_params['reply_spin_us'] applies to a unix:// or tcp:// gateway only")
        reply_spin_us = _int("reply_spin_us", get("reply_spin_us"), 0, 10000)
        if "connect_timeout_ms" in params and gateway == "embedded":
            raise ConfigError("adapter_params['connect_timeout_ms'] applies to a unix:// or tcp:// gateway only")
        connect_timeout_ms = get("connect_timeout_ms")
        if why := connect_timeout_error(connect_timeout_ms):
            raise ConfigError(f"adapter_params['connect_timeout_ms'] {why}")
        token = _token(gateway, params.get("token_file"))
        card = params.get("card")
        if card is None:
            card = default_card_path()
        if not isinstance(card, str) or not card.strip():
            # An empty path (a template's unset variable) made the default image, silently (audit 14).
            raise ConfigError(
                f"adapter_params['card'] must be a path string, got {card!r} (leave the key out for the default, "
                f"{default_card_path()})"
            )
        size = get("card_size_gb")
        if not card_size_ok(size):
            raise ConfigError(
                f"adapter_params['card_size_gb'] must be a number of GiB in {card_size_range()}, got {size!r}"
            )
        metrics_host = get("metrics_host")
        if not isinstance(metrics_host, str) or not metrics_host or any(c.isspace() for c in metrics_host):
            raise ConfigError(f"adapter_params['metrics_host'] must be an address or host name, got {metrics_host!r}")
        if "metrics_host" in params and not params.get("metrics_port"):
            raise ConfigError("adapter_params['metrics_host'] applies only with a metrics_port")
        durable, card_preallocate = get("durable"), get("card_preallocate")
        if not isinstance(durable, bool):
            raise ConfigError(f"adapter_params['durable'] must be true or false, got {durable!r}")
        if not isinstance(card_preallocate, bool):
            raise ConfigError(f"adapter_params['card_preallocate'] must be true or false, got {card_preallocate!r}")
        return cls(
            gateway=gateway,
            card=os.path.abspath(os.path.expanduser(card)),
            card_size_gb=float(size),
            card_preallocate=card_preallocate,
            num_workers=_int("num_workers", params.get("num_workers", 8 if gateway == "embedded" else 4), 1, 64),
            io_depth=_int("io_depth", get("io_depth"), 1, 256),
            timeout_ms=_int("timeout_ms", get("timeout_ms"), 1, 3_600_000),
            durable=durable,
            metrics_port=_int("metrics_port", get("metrics_port"), 0, 65535),
            metrics_host=metrics_host,
            token=token,
            ring_mb=ring_mb,
            direct_loads=direct_loads,
            ring_pieces=ring_pieces,
            process_memory=process_memory,
            ptracer_follow=ptracer_follow,
            gateway_stall_s=float(stall),
            reply_spin_us=reply_spin_us,
            connect_timeout_ms=connect_timeout_ms,
        )

    def to_native(self) -> dict[str, Any]:
        return {
            "gateway": self.gateway,
            "card": self.card,
            "card_size_bytes": int(self.card_size_gb * GIB),
            "card_preallocate": self.card_preallocate,
            "num_workers": self.num_workers,
            "io_depth": self.io_depth,
            "timeout_ms": self.timeout_ms,
            "durable": self.durable,
            "token": self.token,
            "ring_bytes": self.ring_mb * MIB,
            "direct_loads": self.direct_loads,
            "ring_pieces": self.ring_pieces,
            "process_memory": self.process_memory,
            "ptracer_follow": self.ptracer_follow,
            "gateway_stall_ns": round(self.gateway_stall_s * 1e9),
            "reply_spin_us": self.reply_spin_us,
            "connect_timeout_ms": self.connect_timeout_ms,
        }


def read_token_file(path: str, what: str) -> str:
    """The shared token of a TCP gateway: the file's content, surrounding whitespace stripped."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read token file {path!r}: {e.strerror}") from None
    except UnicodeDecodeError:
        # A token made with `head -c 32 /dev/urandom > token` is bytes, not text: the protocol sends the token as
        # text (as a tcp:// connector's token_file gives it), so it is refused here as one line naming the file,
        # not a UnicodeDecodeError traceback naming neither it nor the flag (review33c M3).
        raise ConfigError(
            f"{what}: token file {path!r} must hold text (UTF-8), e.g. made with `openssl rand -hex 32 > {path}`"
        ) from None
    if not token or len(token.encode()) > MAX_TOKEN_BYTES:
        raise ConfigError(f"{what}: token file {path!r} must hold 1 to {MAX_TOKEN_BYTES} bytes of token")
    return token


def tcp_address_error(url: str, min_port: int) -> str | None:
    """Why `url` is not `tcp://HOST:PORT` (a port in [min_port, 65535], nothing after it), or None if it is.

    The native parser read 'tcp://h:9000/' as "port must be 0-65535" and took port 0, where a connector then
    failed every connect (audit 15); HOST is as it parses it: up to the last ':', an IPv6 address in brackets.
    """
    rest = url[len("tcp://") :]
    host, colon, port = rest.rpartition(":")
    if not colon or not host or host == "[]":
        return f"expected tcp://HOST:PORT, as tcp://10.0.0.5:9500 (no {'host' if colon else 'port'} given)"
    if any(c.isspace() or c == "/" for c in rest):
        return "expected tcp://HOST:PORT, with no '/' or space in it (no path, no trailing '/')"
    if not (port.isascii() and port.isdigit()) or not min_port <= int(port) <= 65535:
        return f"the port must be a number in [{min_port}, 65535], got {port!r}"
    return None


def _token(gateway: str, token_file: Any) -> str:
    if not gateway.startswith("tcp://"):
        if token_file is not None:
            raise ConfigError("adapter_params['token_file'] applies to a tcp:// gateway only")
        return ""
    if not isinstance(token_file, str) or not token_file:
        raise ConfigError("adapter_params['token_file'] is required with a tcp:// gateway: a file holding the token")
    return read_token_file(token_file, "adapter_params['token_file']")
