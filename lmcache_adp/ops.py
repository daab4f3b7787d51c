# SPDX-License-Identifier: Apache-2.0
"""Operator commands: `lmcache-adp status`, `verify` and `format`.

register(subparsers) adds them to the `lmcache-adp` command line; each handler
returns the process exit code. Errors an operator can fix (bad arguments, a
card in use, a missing card) are one clear line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from lmcache_adp._native import CardStore, format_card
from lmcache_adp.config import (
    GIB,
    MAX_CONNECT_TIMEOUT_MS,
    MIN_CONNECT_TIMEOUT_MS,
    ConfigError,
    card_size_ok,
    card_size_range,
    connect_timeout_error,
    read_token_file,
)
from lmcache_adp.gateway_stats import GatewayError, address_error, read_gateway_stats
from lmcache_adp.metrics import gateway_not_reached
from lmcache_adp.stats_catalog import CLIENT, STATS

EXIT_OK, EXIT_BAD_CARD, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3


def percentile_us(buckets: list[int], q: float) -> float | None:
    """Upper bound (us) of the log2 bucket holding quantile q; None without samples."""
    total = sum(buckets)
    if not total:
        return None
    seen = 0
    for i, n in enumerate(buckets):
        seen += n
        if seen >= q * total:
            return float(2 ** (i + 1))
    return float(2 ** len(buckets))


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _first_eviction(st: dict[str, Any]) -> str:
    """The card's fill at its first eviction since open (docs/card_format.md, Capacity)."""
    if not st.get("evicted_objects") or "first_eviction_held_bytes" not in st:
        return "- (no eviction since open)"
    held, cap = st["first_eviction_held_bytes"], st.get("capacity_bytes", 0)
    share = f" ({held / cap:.1%} of capacity)" if cap else ""
    return (
        f"{_size(held)} payload{share}; {st.get('first_eviction_inflight_stores', 0)} stores in flight then, "
        f"{st.get('first_eviction_inflight_acked', 0)} acknowledged, {st.get('first_eviction_inflight_failed', 0)} failed"
    )


# Rows of `status` that show one of the card's stats (docs/stats.md, "reported by"), by label.
_CARD_ROWS = {
    "healthy": "healthy",
    "capacity": "capacity_bytes",
    "used": "used_bytes",
    "objects": "objects",
    "evictions": "evicted_objects",
    "held at 1st eviction": "first_eviction_held_bytes",
    "checksum failures": "checksum_failures",
    "I/O errors": "io_errors",
    "memory failures": "memory_failures",
    "media errors": "media_errors",
    "superblock": "superblock_block_zero_bad",
    "damaged at open": "recovery_damaged_regions",
    "recovered at open": "recovered_objects",
}
REPORTED_BY = {stat.name: stat.reported_by for stat in STATS}


def _clients(st: dict[str, Any]) -> str:
    out = f"{st['clients']} ({st.get('refused_connections', 0)} refused by a limit"
    if "status_queries" in st:  # protocol r10: a status query is not a client (an older gateway counts it)
        out += f"; status queries not counted: {st['status_queries']} since start"
    if "status_probes" in st:  # r13: idle connectors' status queries, which ask nothing
        out += f", {st['status_probes']} idle connectors' probes"
    if "refused_status_queries" in st:  # not among the refused clients above
        out += f", {st['refused_status_queries']} refused for being full"
    return out + ")"


def _usable_cpus(st: dict[str, Any]) -> str:
    if "usable_cpus" not in st:
        return "- (a gateway older than the usable_cpus stat)"
    return f"{st['usable_cpus']} (what its spin rule and piece helpers count: affinity, or a cgroup CPU quota if fewer)"


def _ratio(hits: int, misses: int) -> str:
    return f"{hits / (hits + misses):.1%}" if hits + misses else "-"


def _lookups(st: dict[str, Any]) -> str:
    """The hit ratio a card is sized by: of the keys LMCache's lookups asked, those found on the card (an evicted
    key is a lookup miss; audit 15 item 9)."""
    if "lookup_hits" not in st:
        return "- (stats of a release older than the lookup counters)"
    if st["lookup_hits"] is None:  # a card read on its own (`status --card`)
        return "- (counted by the process that serves the card: status --url, or --gateway)"
    hits, misses = st["lookup_hits"], st.get("lookup_misses", 0)
    return f"{hits} / {misses} keys (hit ratio {_ratio(hits, misses)}; evicted keys are misses)"


def superblock_copies(
    st: dict[str, Any], *, opened_read_only: bool = False, rewrite_error: str = "", card: str = ""
) -> tuple[str, bool]:
    """The superblock's two copies at the open (block 0 and its backup at 1 MiB - 4 KiB; docs/card_format.md,
    "The backup superblock"): a line, and whether a copy is still bad (not rewritten). `opened_read_only`: the stats
    are of a read-only open (status --card, verify), which writes nothing; else of a read-write open (a gateway's,
    verify --repair's), whose rewrite failed where a copy is still bad: `rewrite_error` (CardStore's
    superblock_rewrite_error, where this process opened the card) says what failed where. A backup never written
    (superblock_backup_blank: a card formatted by an older build) is a note, not a bad copy."""
    block0, backup = st.get("superblock_block_zero_bad", 0), st.get("superblock_backup_bad", 0)
    blank = st.get("superblock_backup_blank", 0)
    if not block0 and not backup and not blank:
        return "both copies good (block 0 and the backup at 1 MiB - 4 KiB)", False
    rewritten = st.get("superblock_rewritten", 0)
    if block0:
        what = (
            "block 0 bad (unreadable, blank, torn, not a superblock or damaged past it): opened with the backup at "
            "1 MiB - 4 KiB"
        )
        fixed = "block 0 rewritten from it"
    elif backup:
        what = "the backup at 1 MiB - 4 KiB bad (unreadable, damaged or another superblock; block 0 good)"
        fixed = "rewritten from block 0"
    else:
        what = "no backup superblock yet at 1 MiB - 4 KiB (card formatted by an older build)"
        fixed = "written from block 0 at this open"
    if rewritten:
        return f"{what}; {fixed}", False
    if opened_read_only:
        if not block0 and not backup:
            return f"{what}; written at the next read-write open (the gateway's, or verify --repair)", False
        return (
            f"{what}; not rewritten (a read-write open rewrites it: verify --repair, or the gateway; block 0's bytes "
            "past its superblock, which may be another program's: verify --repair alone)",
            True,
        )
    if block0 and not rewrite_error:
        # A read-write open that did not rewrite block 0 and said no error here (a gateway's, status --url): its write
        # failed, or block 0's bytes past its superblock were kept, which only verify --repair rewrites (review40).
        return (
            f"{what}; not rewritten at that open: the WARNING its process logged says why (its write failed: the error "
            "and offset; or block 0's bytes past its superblock kept, as they may be another program's: verify "
            "--repair rewrites them)",
            True,
        )
    # A read-write open whose write failed: running it again fails the same way; the device is the next step.
    failed = rewrite_error or "its error and offset are in the WARNING the process that opened the card logged"
    last = f"`lmcache-adp format --card {card} --yes`" if card else "`lmcache-adp format --card CARD --yes`"
    return (
        f"{what}; rewriting it failed ({failed}): the card is served with the good copy meanwhile. Check the device "
        f"(its kernel log, SMART); if that block keeps refusing writes, {last} makes a new card as a last resort "
        "(the cache on it is lost)",
        True,
    )


def format_status(st: dict[str, Any], *, opened_read_only: bool = False) -> str:
    """status's rows; `opened_read_only`: `st` is of the card opened read-only here (status --card)."""
    hits, misses = st.get("hits", 0), st.get("misses", 0)
    cap = st.get("capacity_bytes", 0)
    rows = [
        ("card", st.get("card", "-")),
        ("healthy", "yes" if st.get("healthy", True) else "NO (last card I/O failed)"),
        ("capacity", _size(cap)),
        ("used", f"{_size(st.get('used_bytes', 0))} ({st.get('used_bytes', 0) / cap:.1%})" if cap else "-"),
        ("objects", st.get("objects", 0)),
        # The headline: keys found by LMCache's lookups. The load ratio below read 100% while prompts were lost to
        # eviction, since LMCache loads only what its lookup found (audit 15 item 9; docs/stats.md, lookup_hits).
        ("lookup hits / misses", _lookups(st)),
        (
            "load hits / misses",
            f"{hits} / {misses} objects (load hit ratio {_ratio(hits, misses)}; only keys a lookup found are loaded)",
        ),
        # Two counts side by side, as hits / misses: "stores (failed) 2 (2)" read as both stores failed where two
        # were stored and two more failed (audit 15; `stores` counts the acknowledged only, docs/stats.md).
        ("stored / failed", f"{st.get('stores', 0)} / {st.get('store_failures', 0)} objects"),
        ("evictions", f"{st.get('evicted_objects', 0)} objects in {st.get('evicted_regions', 0)} regions"),
        ("held at 1st eviction", _first_eviction(st)),
        ("checksum failures", st.get("checksum_failures", 0)),
        ("I/O errors", st.get("io_errors", 0)),
        # Not the card's: this process had no memory for staging or a bounce buffer (docs/stats.md).
        ("memory failures", f"{st.get('memory_failures', 0)} operations (out of memory here; the card did not fail)"),
        (
            "media errors",
            f"{st.get('media_errors', 0)} regions with unreadable blocks at open (the objects on them lost)",
        ),
        ("superblock", superblock_copies(st, opened_read_only=opened_read_only)[0]),
        (
            "damaged at open",
            f"{st.get('recovery_damaged_regions', 0)} regions ({st.get('recovery_lost_objects', 0)} objects, "
            f"{_size(st.get('recovery_lost_bytes', 0))} lost to the damage)",
        ),
        ("recovered at open", f"{st.get('recovered_objects', 0)} objects in {st.get('recovery_seconds', 0):.2f} s"),
    ]
    if "gateway_reachable" in st:  # a connector on a gateway (docs/stats.md)
        # The card's rows are the gateway's to report: a client's stats carry them at their first value
        # (capacity 0 B, 0 objects, healthy), which read as an empty card (audit 12). Point at the gateway.
        rows = [r for r in rows if r[0] not in _CARD_ROWS or CLIENT in REPORTED_BY[_CARD_ROWS[r[0]]]]
        card = st.get("card", "-")
        # A TCP gateway takes its token: the status command reads it only from --token-file (review r12 N2).
        token = " --token-file <its token file>" if card.startswith("tcp://") else ""
        rows[0] = ("card", f"the gateway's at {card}: lmcache-adp status --gateway {card}{token}")
        reach = (
            "yes"
            if st["gateway_reachable"]
            else "NO (loads miss, stores are dropped; /health answers 503): "
            + gateway_not_reached("the gateway", st.get("gateway_error") or "")
        )
        if st.get("gateway_token_refused"):
            reach = "NO: the gateway refused this connector's token (fix token_file, restart; /health answers 503)"
        rows.insert(1, ("gateway reachable", f"{reach}; {st.get('gateway_reconnects', 0)} reconnects"))
        if st.get("gateway_stalled"):
            rows.insert(
                2, ("gateway stalled", "YES (a request waited gateway_stall_s with nothing heard; /health answers 503)")
            )
        if not st.get("gateway_card_healthy", True):
            rows.insert(2, ("gateway's card", f"FAILING I/O: {st.get('gateway_card_error', '')}"))
    if "clients" in st:  # a gateway (docs/stats.md: the gateway's own stats)
        rows += [
            ("connected clients", _clients(st)),
            ("usable CPUs", _usable_cpus(st)),
            ("batches served", st.get("batches", 0)),
            ("rings", f"{_size(st.get('ring_bytes', 0))} mapped, {_size(st.get('ring_used_bytes', 0))} in use"),
            (
                "process memory",
                f"{st.get('processes', 0)} connections ({st.get('process_refusals', 0)} refused); "
                f"{st.get('process_loads', 0)} loads, {st.get('process_stores', 0)} stores",
            ),
            (
                "store buffers",
                f"{_size(st.get('store_buffer_bytes', 0))} held, {st.get('store_buffer_waiting', 0)} connections "
                f"waiting, {st.get('store_buffer_busy', 0)} chunks failed Busy",
            ),
        ]
    for op, snap in (st.get("latency_us_log2") or {}).items():
        if snap["count"]:
            p = [percentile_us(snap["buckets"], q) for q in (0.5, 0.9, 0.99)]
            rows.append(
                (f"{op} latency", f"p50 <{p[0]:.0f} us, p90 <{p[1]:.0f} us, p99 <{p[2]:.0f} us ({snap['count']} ops)")
            )
    rows.append(("every stat", "--json; what each means: docs/stats.md"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _open_card(path: str, *, read_only: bool, restore_block_zero: bool = False) -> CardStore:
    if not os.path.exists(path):
        raise SystemExit(_fail(f"card {path} does not exist", EXIT_USAGE))
    try:
        # A blank file or device is refused, not formatted: status and verify never write to it. Read-only
        # (O_RDONLY, still locked against a gateway or a server): a disk the kernel remounted read-only after
        # errors is when verify is wanted, and an image the operator may not write is read (audit 15).
        # restore_block_zero: verify --repair only, the operator's command: a block 0 of another kind's bytes beside
        # a valid backup superblock is rewritten from the backup (every other open refuses that card; fd39).
        return CardStore(
            path, 0, durable=True, format_blank=False, read_only=read_only, restore_block_zero=restore_block_zero
        )
    except RuntimeError as e:
        msg = str(e)
        if "already open" in msg:
            msg += "; ask the process that holds it (lmcache-adp status --url/--gateway)"
        elif not read_only and ("Read-only file system" in msg or "Permission denied" in msg):
            # Only --repair opens read-write: it writes (it marks the bad objects deleted).
            msg += (
                "; --repair writes to the card (it marks the bad objects deleted): run verify without --repair to "
                "check it, or --repair on a writable copy (cp --sparse=always; a block device: dd it to a file)"
            )
        raise SystemExit(_fail(msg, EXIT_ERROR)) from None
    except ValueError as e:
        raise SystemExit(_fail(str(e), EXIT_BAD_CARD)) from None


def _fail(msg: str, code: int) -> int:
    print(f"lmcache-adp: error: {msg}", file=sys.stderr)
    return code


def stats_url(url: str) -> str:
    """The /stats address of a metrics endpoint as an operator may write it: with or without http://, or with
    the path of another of its pages (/metrics, /health, /stats) pasted from a browser or a scrape config."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    for page in ("/metrics", "/health", "/stats"):
        url = url.removesuffix(page)
    return url + "/stats"


# status --gateway's connect bound when --connect-timeout-ms is not given: the command's fixed 5 s of before
# session 30 (a connector's adapter_params connect_timeout_ms is 2000 by default).
STATUS_CONNECT_TIMEOUT_MS = 5000


def connect_timeout_ms(text: str) -> int:
    """--connect-timeout-ms's value, or argparse's usage error (exit 2) in adapter_params connect_timeout_ms's words."""
    try:
        value: Any = int(text)
    except ValueError:
        value = text
    if why := connect_timeout_error(value):
        raise argparse.ArgumentTypeError(why)
    return value


def cmd_status(args: argparse.Namespace) -> int:
    if args.connect_timeout_ms is not None and not args.gateway:
        return _fail("--connect-timeout-ms applies with --gateway only", EXIT_USAGE)
    if args.gateway and (why := address_error(args.gateway)):
        return _fail(why, EXIT_USAGE)
    if args.gateway:
        bound = args.connect_timeout_ms or STATUS_CONNECT_TIMEOUT_MS
        try:
            token = read_token_file(args.token_file, "--token-file") if args.token_file else ""
            st = read_gateway_stats(args.gateway, token, connect_timeout_ms=bound)
        except (GatewayError, ConfigError) as e:
            if args.gateway.startswith("tcp://") and not args.token_file and "authentication failed" in str(e):
                return _fail(f"{e}: a tcp:// gateway asks for its token: --token-file FILE", EXIT_ERROR)  # audit 13
            if "did not answer its connect within" in str(e):
                return _fail(f"{e} (--connect-timeout-ms: raise it for a slow link or a loaded gateway)", EXIT_ERROR)
            return _fail(str(e), EXIT_ERROR)
        st["card"] = f"held by the gateway at {args.gateway}"
    elif args.url:
        url = stats_url(args.url)
        hint = "is it the metrics port of lmcache-adp (adapter_params metrics_port, gateway --metrics-port)?"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                st = json.load(r)
        except urllib.error.HTTPError as e:  # an OSError too: answered, but not ours
            return _fail(f"cannot read {url}: HTTP {e.code} {e.reason}; {hint}", EXIT_ERROR)
        except OSError as e:
            return _fail(f"cannot read {url}: {getattr(e, 'reason', None) or e}", EXIT_ERROR)
        except http.client.HTTPException as e:  # answered, but not in HTTP (BadStatusLine; review r12 N5)
            if str(e).startswith("ADPG"):  # a gateway's Error frame: its TCP port (--listen), not --metrics-port
                hostport = url.removeprefix("http://").removesuffix("/stats")
                return _fail(
                    f"cannot read {url}: that is a gateway's TCP port: "
                    f"lmcache-adp status --gateway tcp://{hostport} --token-file F",
                    EXIT_ERROR,
                )
            return _fail(f"cannot read {url}: {type(e).__name__}: {str(e).strip()!r}; {hint}", EXIT_ERROR)
        except ValueError as e:  # a bad URL, or an answer that is not JSON (another server's page)
            return _fail(f"cannot read {url}: {e}; {hint}", EXIT_ERROR)
        if not isinstance(st, dict):
            return _fail(f"{url} answered JSON that is not lmcache-adp's stats; {hint}", EXIT_ERROR)
    else:
        store = _open_card(args.card, read_only=True)
        st = store.stats()
        store.close()
        st["card"] = args.card
        # Lookups are counted by the process serving the card, never by the card: null, not a 0 / 0 that reads
        # as "no lookups" (review r16 N4; the text row says where they are).
        st["lookup_hits"] = st["lookup_misses"] = None
    print(
        json.dumps(st, indent=2, sort_keys=True) if args.json else format_status(st, opened_read_only=bool(args.card))
    )
    return EXIT_OK


class _Progress:
    """A bar on a terminal (tqdm), a line every few seconds otherwise."""

    def __init__(self, stream=sys.stderr, every_s: float = 5.0):
        self.stream, self.every_s, self.last, self.bar = stream, every_s, 0.0, None
        if stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=0, unit="obj", file=stream, desc="verify")

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.n = done
            self.bar.refresh()
        elif time.monotonic() - self.last >= self.every_s or done == total:
            self.last = time.monotonic()
            print(f"verify: {done}/{total} objects", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_verify(args: argparse.Namespace) -> int:
    read_only = not args.repair
    store = _open_card(args.card, read_only=read_only, restore_block_zero=args.repair)
    progress = _Progress()
    try:
        # Regions recovery could not read at this open: what was on the failed blocks is not in the index, so
        # verify cannot read it (review r16: such a card was reported "clean").
        opened = store.stats()
        unreadable = opened.get("media_errors", 0)
        # Regions recovery found damaged (a header that reads back wrong): the records of damaged headers (and what
        # lay behind a damaged region header) are not in the index, so verify cannot read them; recovery logged
        # each region at ERROR.
        damaged = {k: opened.get(k, 0) for k in ("recovery_damaged_regions", "recovery_lost_objects")}
        damaged["recovery_lost_bytes"] = opened.get("recovery_lost_bytes", 0)
        superblock = superblock_copies(
            opened, opened_read_only=read_only, rewrite_error=store.superblock_rewrite_error, card=args.card
        )
        report = store.verify(repair=args.repair, progress=progress)
    finally:
        progress.close()
        store.close()
    lines, code = verify_summary(
        args.card, report, unreadable_regions=unreadable, read_only=read_only, damaged=damaged, superblock=superblock
    )
    print("\n".join(lines))
    return code


def verify_summary(
    card: str,
    report: dict,
    *,
    unreadable_regions: int,
    read_only: bool,
    damaged: dict | None = None,
    superblock: tuple[str, bool] | None = None,
) -> tuple[list[str], int]:
    """verify's lines: what it read and checked, what it did not, the verdict; and its exit code (0: every object
    the index holds was checked and passed or was dropped, and every region was read at open and found undamaged;
    1: bad objects remain, or regions could not be read at open, or recovery found regions damaged (`damaged`:
    the open's recovery_damaged_regions, _lost_objects, _lost_bytes); 3: none of these, but verify could not check
    some objects: no memory to read them into, or deleted or replaced while it read, which no process holding the
    card should do). `superblock`: superblock_copies() of the open; a copy still bad (read-only, or a rewrite that
    failed) is exit 1 too, one the open (--repair) rewrote is said and is not, and so is a backup not written yet
    (a card of an older build: a note)."""
    sb_line, sb_bad = superblock or ("", False)
    damaged_regions = (damaged or {}).get("recovery_damaged_regions", 0)
    lines = [f"bad object: {line}" for line in report["bad_objects"]]
    left = report["bad"] - report["repaired"]
    no_memory, gone = report["no_memory"], report["gone"]
    if report["bad"]:
        verdict = f"{report['bad']} bad, {report['repaired']} dropped"
    elif unreadable_regions or damaged_regions or no_memory or gone or sb_bad:
        verdict = "not clean (below)"
    else:
        verdict = "clean"
    mode = " (opened read-only: nothing written)" if read_only else ""
    lines.append(
        f"{card}{mode}: {report['checked']} objects, {_size(report['bytes'])} checked, every object the card's index "
        f"holds{' but those below' if no_memory or gone else ''} (header, key and payload checksum, as a load reads "
        f"them): {verdict}"
    )
    lines.append("not checked: what the index does not hold (deleted objects, older copies, stores a crash cut off)")
    if unreadable_regions:
        lines.append(
            f"not checked: {unreadable_regions} regions had blocks that could not be read when the card was opened "
            "(media_errors): the objects on them (a whole region where its header failed) are lost and were not read; "
            "check the device"
        )
    if sb_line and not sb_line.startswith("both copies good"):
        lines.append(f"superblock: {sb_line}")
    if damaged_regions:
        assert damaged is not None
        lines.append(
            f"not checked: {damaged_regions} regions were found damaged when the card was opened "
            f"(recovery_damaged_regions: a header that reads back wrong, no crash's cut): "
            f"{damaged['recovery_lost_objects']} objects ({_size(damaged['recovery_lost_bytes'])}) are lost, the "
            "record of each damaged object header (the walk resumed behind it: what it found is checked above) and "
            "the objects behind a damaged region header; the ERROR lines above name each region and offset; check "
            "the device"
        )
        lines += [f"damaged at open: {span}" for span in report.get("damaged_spans", [])]
    if no_memory:
        lines.append(
            f"not checked: {no_memory} objects ({_size(report['no_memory_bytes'])}): verify had no memory to "
            "read them into (no fault of theirs); run it again with more memory free"
        )
    if gone:
        lines.append(
            f"not checked: {gone} objects were deleted or replaced while verify read the card (is a process writing "
            "to it?); run it again with no process using the card"
        )
    if left and read_only:
        lines.append("run again with --repair to drop the bad objects (it writes to the card)")
    elif left:
        lines.append(
            f"{left} bad objects could not be read back and were left on the card (an I/O error: check the device)"
        )
    if left or unreadable_regions or damaged_regions or sb_bad:
        return lines, EXIT_BAD_CARD
    return lines, EXIT_ERROR if no_memory or gone else EXIT_OK


def cmd_format(args: argparse.Namespace) -> int:
    exists = os.path.exists(args.card)
    if not exists and args.size_gb is None:
        return _fail(f"card {args.card} does not exist; give --size-gb to create it", EXIT_USAGE)
    if args.size_gb is not None and not card_size_ok(args.size_gb):
        return _fail(f"--size-gb must be a number of GiB in {card_size_range()}, got {args.size_gb:g}", EXIT_USAGE)
    if exists and not args.yes:
        if not sys.stdin.isatty():
            return _fail(f"refusing to wipe {args.card} without --yes (no terminal to ask on)", EXIT_USAGE)
        answer = input(f"Wipe every object on {args.card}? Type 'yes' to continue: ")
        if answer.strip() != "yes":
            print("not formatted")
            return EXIT_USAGE
    size = int(args.size_gb * GIB) if args.size_gb and not exists else 0
    try:
        format_card(args.card, size, 0, args.preallocate)
    except (RuntimeError, ValueError) as e:
        if exists and os.path.isfile(args.card) and "are needed" in str(e):
            # An existing file keeps its size (--size-gb is for a new one): say how to get a card there (audit 14).
            return _fail(
                f"{e} (an existing file keeps its size: remove it, then --size-gb N makes a new image)", EXIT_ERROR
            )
        return _fail(str(e), EXIT_ERROR)
    print(f"formatted {args.card}")
    if exists and args.size_gb is not None:
        print(f"--size-gb ignored: {args.card} existed and keeps its size (remove the file to make a new size)")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="capacity, usage, hit ratio, errors and latency of a card")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--card", help="card path (must not be held by a running process)")
    src.add_argument("--gateway", metavar="unix://PATH|tcp://HOST:PORT", help="a running gateway, through its socket")
    src.add_argument(
        "--url",
        help="metrics URL of a running connector or gateway, e.g. http://127.0.0.1:9400 (or 127.0.0.1:9400, or the URL of "
        "its /metrics or /health page)",
    )
    p.add_argument("--token-file", help="with --gateway tcp://: the gateway's token")
    p.add_argument(
        "--connect-timeout-ms",
        type=connect_timeout_ms,
        metavar="MS",
        help=f"with --gateway: the connect and its handshake give up after this many milliseconds "
        f"({MIN_CONNECT_TIMEOUT_MS}-{MAX_CONNECT_TIMEOUT_MS}; default {STATUS_CONNECT_TIMEOUT_MS}; a connector's "
        "adapter_params connect_timeout_ms, 2000 by default)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "verify",
        help="check every object's checksum on a card no process holds",
        description="Reads every object the card's index holds and checks it as a load would; says what it did not "
        "read. Exit 0: clean (or every bad object dropped); 1: bad objects remain, regions could not be read when the "
        "card was opened, regions recovery found damaged when it opened the card (a header that reads back wrong "
        "where no crash could have cut a write), a copy of the superblock is bad (block 0 holding data of another kind beside "
        "a valid backup: --repair rewrites it from the backup; a backup not written yet, on a card an older build "
        "formatted, is a note, not bad) or --repair's rewrite of it failed (its error and offset said), or the path holds "
        "no card of this format; 2: no such path; 3: it "
        "could not be opened (held by a process, blank, not writable for --repair), or, with none of 1's, it could not check some "
        "objects (no memory to read them into; deleted or replaced while it read).",
    )
    p.add_argument("--card", required=True, help="card path (must not be held by a running process)")
    p.add_argument(
        "--repair",
        action="store_true",
        help="drop the objects that fail, and rewrite a bad copy of the superblock from the good one: block 0 from the "
        "backup also where it holds data of another kind (damage or another program's: your decision; logged)",
    )
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("format", help="create or wipe a card")
    p.add_argument(
        "--card", required=True, help="block device or card image file (must not be held by a running process)"
    )
    p.add_argument(
        "--size-gb",
        type=float,
        help=f"size of a new image file, GiB {card_size_range()} (sparse, unless --preallocate); ignored for an "
        "existing card",
    )
    p.add_argument(
        "--preallocate",
        action="store_true",
        help="with --size-gb: a new image file's blocks are allocated when it is created (fallocate; not on tmpfs), "
        "instead of sparse (allocated as the first stores write them)",
    )
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_format)
