# SPDX-License-Identifier: Apache-2.0
"""Every stat lmcache-adp reports, in one table (stats v1): its name, kind,
unit, who reports it and what it means. The Prometheus export
(lmcache_adp/metrics.py) is made from it and docs/stats.md is rendered from it
(`python scripts/render_stats_md.py`; tests/ops/test_stats_catalog.py
checks that the two agree and that every key the live stats carry is here).

Who reports a stat:

    embedded  an ADPConnector on its own card (adapter_params gateway "embedded")
    client    an ADPConnector through a gateway (unix:// or tcp://)
    gateway   the `lmcache-adp gateway` daemon (StatsReply, `status --gateway`)

Each reads its stats from `stats()` (a connector), a Stats frame (a gateway),
`/stats` where a metrics port is open, or `lmcache-adp status --json`.

Rules: a name is never reused with another meaning; a stat whose meaning
changes gets a new name (the old one is listed in RETIRED, with its version).
Adding a stat adds a row here (and re-renders docs/stats.md); it does not
change the version. Removing or renaming one bumps VERSION.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

VERSION = 1

EMBEDDED, CLIENT, GATEWAY = "embedded", "client", "gateway"
SOURCES = (EMBEDDED, CLIENT, GATEWAY)
E, C, G = frozenset({EMBEDDED}), frozenset({CLIENT}), frozenset({GATEWAY})

COUNTER, GAUGE = "counter", "gauge"

# The steps of the gateway's load profile, in src_cpp/util/load_profile.h's
# order (kNames; the header says what each one times).
LOAD_PROFILE_STEPS: tuple[str, ...] = (
    *("batch", "object", "lookup", "pin", "copy", "unpin", "sink", "alive", "lease", "write", "run", "combine"),
    *("piece", "index", "first_look", "header"),
    *("seg_item", "seg_context", "seg_get", "seg_prepare", "seg_lease", "seg_copy"),
)

# Entries of the stats dicts that are not numbers, with why they are not in
# the table (nor exported to Prometheus as a family of their own).
NOT_NUMERIC = {
    "card": "a string: the card's path (embedded, gateway) or the gateway's address (client)",
    "gateway_card_error": "a string (a connector on a gateway): the gateway's message of the I/O error that made "
    "gateway_card_healthy 0, empty while it is 1",
    "gateway_error": "a string (a connector on a gateway): why the gateway is not reached, empty from a successful "
    "connect: the last failure that took the link down or kept it down (a connect or handshake, the gateway's "
    "refusal verbatim, such as a ring_mb above its --max-ring-mb, or a lost connection), ending in what to fix "
    "where no retry heals it (`... a retry cannot heal this: fix ring_mb (or the gateway's --max-ring-mb) and "
    "restart`). /health's reason and `lmcache-adp status --url` show it while gateway_reachable is 0",
    "latency_us_log2": "nested: per operation, a count, a sum and log2 microsecond buckets; "
    "exported as the histogram lmcache_adp_op_latency_seconds{op=get|set|exists|delete}",
}

# Names no longer reported, with the last version that had them: never reused.
RETIRED: dict[str, int] = {}

PREFIX = "lmcache_adp_"


@dataclass(frozen=True)
class Stat:
    """One stat. `name` may hold "{step}": one key per load-profile step."""

    name: str
    kind: str  # COUNTER: only grows while the process runs; GAUGE: a level
    unit: str  # what one unit of the value is
    reported_by: frozenset[str]
    meaning: str
    only_with: str = ""  # a condition for the key to be there at all
    metric_name: str = ""  # the family's name where it is not the stat's (per-step keys: one family)

    @property
    def per_step(self) -> bool:
        return "{step}" in self.name

    def keys(self) -> list[str]:
        if self.per_step:
            return [self.name.format(step=s) for s in LOAD_PROFILE_STEPS]
        return [self.name]

    @property
    def metric(self) -> str:
        """The Prometheus family: lmcache_adp_ + the name (or metric_name), nanoseconds
        as seconds (`_ns` -> `_seconds`). Counters are served with `_total` added."""
        name = self.metric_name or self.name
        if name.endswith("_ns"):
            name = name[: -len("_ns")] + "_seconds"
        return PREFIX + name

    @property
    def scale(self) -> float:
        """Factor from the stat's value to the metric's (1e-9 for nanoseconds)."""
        return 1e-9 if self.unit == "nanoseconds" else 1.0

    def samples(self, st: dict) -> Iterator[tuple[tuple[str, ...], float]]:
        """(labels, value) of each of this stat's keys present in st."""
        if self.per_step:
            for s in LOAD_PROFILE_STEPS:
                k = self.name.format(step=s)
                if k in st:
                    yield (s,), float(st[k]) * self.scale
        elif self.name in st:
            yield (), float(st[self.name]) * self.scale

    @property
    def labels(self) -> list[str]:
        return ["step"] if self.per_step else []


_CARD = E | G  # the card's own state: the embedded store's, or the gateway's
_OPS = E | C | G  # the operations a client of a card sees: counted by each side
_PROCESS = C | G  # protocol r5: process-memory loads and stores

# The card's list (src_cpp/common/store_types.h, for_each_stat): every stats
# dict carries these keys; a source that does not report one holds it at its
# first value (CARD_LIST_DEFAULTS).
CARD_LIST: tuple[Stat, ...] = (
    Stat("capacity_bytes", GAUGE, "bytes", _CARD, "Bytes of the card's regions (num_regions x region_bytes)"),
    Stat("used_bytes", GAUGE, "bytes", _CARD, "Bytes of the card held by live objects, headers and padding included"),
    Stat(
        "payload_bytes", GAUGE, "bytes", _CARD, "Payload bytes of the objects held (used_bytes less headers, padding)"
    ),
    Stat("objects", GAUGE, "objects", _CARD, "Objects on the card"),
    Stat("region_bytes", GAUGE, "bytes", _CARD, "Size of one region, the unit of eviction (set when formatted)"),
    Stat("num_regions", GAUGE, "regions", _CARD, "Regions on the card"),
    Stat("free_regions", GAUGE, "regions", _CARD, "Regions not holding objects"),
    Stat(
        "hits",
        COUNTER,
        "objects",
        _OPS,
        "Loads served: from the card (embedded, gateway); through the gateway, this client's own (client)",
    ),
    Stat(
        "misses",
        COUNTER,
        "objects",
        _OPS,
        "Loads not served: the key is not on the card, the object failed its checks, or the load failed. LMCache "
        "loads only the keys its lookup (exists) found on the card, so a key the card evicted is not counted: "
        "hits / (hits + misses) is that of loads, near 1 however much the card evicts (audit 15); "
        "lookup_hits / lookup_misses are what a card is sized by",
    ),
    Stat(
        "lookup_hits",
        COUNTER,
        "keys",
        _OPS,
        "Keys LMCache's lookups (exists) found on the card, once per key asked: counted by a connector when the "
        "lookup's answer reaches LMCache (embedded, client; a lookup that failed or timed out, which LMCache reads "
        "as all misses, counts in neither lookup_hits nor lookup_misses), and by the gateway per key asked of it "
        "(all its clients'). lookup_hits / (lookup_hits + lookup_misses) is the hit ratio a card is sized by: "
        "`lmcache-adp status` shows it first. The card itself does not count them (`status --card --json`: null)",
    ),
    Stat(
        "lookup_misses",
        COUNTER,
        "keys",
        _OPS,
        "Keys LMCache's lookups (exists) did not find on the card, once per key asked (counted as lookup_hits): "
        "keys never stored and keys the card evicted alike. LMCache loads only what its lookup found, so these "
        "never reach a load and are not in `misses`",
    ),
    Stat("stores", COUNTER, "objects", _OPS, "Objects stored (acknowledged)"),
    Stat(
        "store_failures",
        COUNTER,
        "objects",
        _OPS,
        "Objects that could not be stored; a gateway's: by its card, not those whose read from the client's "
        "process memory failed (a bad address, the lease revoked, the client gone: the client's failure, "
        "answered to it, also when the store was pipelined)",
    ),
    Stat("deletes", COUNTER, "objects", _OPS, "Objects deleted on request"),
    Stat("evicted_objects", COUNTER, "objects", _CARD, "Objects evicted to make room"),
    Stat("evicted_regions", COUNTER, "regions", _CARD, "Regions evicted (whole, least recently used) to make room"),
    Stat(
        "checksum_failures",
        COUNTER,
        "objects",
        _CARD,
        "Objects that failed their checksum on read (a miss; the object is dropped); a header read while a "
        "delete or re-store rewrote it is a plain miss, not counted here (docs/card_format.md, Writing)",
    ),
    Stat(
        "io_errors",
        COUNTER,
        "errors",
        _CARD,
        "Card I/O operations that failed (the card's: not those that failed for want of this process's memory, "
        "counted in memory_failures)",
    ),
    Stat(
        "memory_failures",
        COUNTER,
        "operations",
        _CARD,
        "Card operations (loads, stores, tombstone writes) that failed for want of this process's own memory: "
        'its staging or a bounce buffer could not grow ("out of memory for staging", "... for a bounce '
        'buffer", I/O-error class 2). The host is short of memory, the card is not failing: not in io_errors, '
        "`healthy` stays 1. A store failed so is also in store_failures",
    ),
    Stat(
        "media_errors",
        COUNTER,
        "regions",
        _CARD,
        "Regions with a read that failed at open (an I/O error: the objects whose header blocks failed lost, or the "
        "whole region where its header failed; the rest served). Damage that reads back wrong is "
        "recovery_damaged_regions",
    ),
    Stat(
        "superblock_block_zero_bad",
        GAUGE,
        "copies",
        _CARD,
        "1 where the card's superblock (block 0) was unreadable, blank, torn, not a superblock, or damaged past its "
        "superblock (the rest of its 4 KiB not zeros, the backup whole) at the open and the card opened with its "
        'backup copy (at 1 MiB - 4 KiB; docs/card_format.md, "The backup superblock"); a read-write open rewrites '
        "block 0 from it (superblock_rewritten), but for a block 0 damaged past its superblock, which verify --repair "
        "alone rewrites (those bytes may be another program's: a partition table). 0 otherwise",
    ),
    Stat(
        "superblock_backup_bad",
        GAUGE,
        "copies",
        _CARD,
        "1 where the backup superblock (at 1 MiB - 4 KiB) was unreadable, damaged or another superblock than "
        "block 0's at the open, block 0 valid; a read-write open rewrites it from block 0 (superblock_rewritten). "
        "0 otherwise (also where its block was all zeros: superblock_backup_blank)",
    ),
    Stat(
        "superblock_backup_blank",
        GAUGE,
        "copies",
        _CARD,
        "1 where the backup superblock's block (at 1 MiB - 4 KiB) was all zeros at the open, block 0 valid: no "
        "backup yet, a card formatted by a build before session 39 (never written there), not damage; a read-write "
        "open writes it from block 0 (superblock_rewritten). 0 otherwise",
    ),
    Stat(
        "superblock_rewritten",
        GAUGE,
        "copies",
        _CARD,
        "1 where this open rewrote the bad copy of the superblock (superblock_block_zero_bad or _backup_bad) from the "
        "good one, or wrote the missing backup (superblock_backup_blank); 0 where both were good, the open was "
        "read-only (status, verify without --repair), or the write failed (a WARNING with the error and the offset: "
        "the card is served as opened and the next open reads the good copy again)",
    ),
    Stat(
        "region_waits",
        COUNTER,
        "stores",
        _CARD,
        "Stores that found no region free or evictable (every sealed region pinned by a load or store in flight) "
        "and waited for one: up to 5 s from the store's start, then refused (NoSpace; docs/card_format.md, "
        "Eviction). Not counted: a store refused at once, every such region being pinned by its own put (its "
        "earlier objects' regions, or those of the object being stored), or one with no time left to wait (a put's "
        "objects after one whose wait ran out; a store whose 5 s ran out while it queued behind a waiting one): "
        "their refusals count in store_failures",
    ),
    Stat(
        "writes_overlapped",
        COUNTER,
        "stores",
        _CARD,
        "Disk stores copied (or filled) and checksummed while the store before them, of the same put, was being "
        "written (its write in flight through the card's Linux AIO context): a worker's slice of K objects of one "
        "write each (up to 4 MiB staged, under 1 MiB zero-copy) overlaps K-1. 0 on a tmpfs card, where io_setup "
        "failed (a WARNING at the first store), or with ADP_CARD_AIO=0",
    ),
    Stat(
        "retired_regions",
        GAUGE,
        "regions",
        _CARD,
        "Regions retired since the card was opened: the frontier opened each and its header block refused a write "
        "(a bad block; a WARNING \"region R's header block refused a write; the region is retired until the card is "
        'reopened" each). Never evicted or handed out again: capacity lost until the card is reopened (the next open '
        "retires a region again the first time its header refuses a write). A failed sync retires none",
    ),
    Stat(
        "bytes_written",
        COUNTER,
        "bytes",
        _OPS,
        "Bytes written: to the card, headers included (embedded, gateway); payload of this client's stores (client)",
    ),
    Stat(
        "bytes_read",
        COUNTER,
        "bytes",
        _OPS,
        "Bytes read: from the card (embedded, gateway); payload of this client's hits (client)",
    ),
    Stat(
        "first_eviction_held_bytes",
        GAUGE,
        "bytes",
        _CARD,
        "Payload held at the first eviction since open, stores then in flight and acknowledged later included "
        "(0 before it; docs/card_format.md, Capacity)",
    ),
    Stat(
        "first_eviction_inflight_stores",
        GAUGE,
        "objects",
        _CARD,
        "Stores in flight at the first eviction since open",
    ),
    Stat(
        "first_eviction_inflight_acked",
        GAUGE,
        "objects",
        _CARD,
        "Of the stores in flight at the first eviction, those acknowledged so far",
    ),
    Stat(
        "first_eviction_inflight_failed",
        GAUGE,
        "objects",
        _CARD,
        "Of the stores in flight at the first eviction, those failed so far",
    ),
    Stat("recovered_objects", GAUGE, "objects", _CARD, "Objects found on the card when it was opened"),
    Stat("recovery_seconds", GAUGE, "seconds", _CARD, "Time the card's open took to walk its regions"),
    Stat(
        "recovery_damaged_regions",
        GAUGE,
        "regions",
        _CARD,
        "Regions the card's open found damaged, where no crash could have cut a write (a header of this card that "
        "fails its checksum, or a region header the frontier's chain names that is not one): each logged at ERROR "
        "with its offset and what it cost; the rest of the card served (docs/card_format.md, Recovery)",
    ),
    Stat(
        "recovery_lost_objects",
        GAUGE,
        "objects",
        _CARD,
        "Objects lost to the damage of recovery_damaged_regions: the record of each damaged object header (the "
        "walk resumes behind it), and the objects found behind a damaged region header (a block-by-block look) "
        "that no newer copy or delete supersedes",
    ),
    Stat(
        "recovery_lost_bytes",
        GAUGE,
        "bytes",
        _CARD,
        "Payload of recovery_lost_objects (a damaged object header's record: its blocks up to where the walk resumed)",
    ),
    Stat(
        "store_seqs_left",
        GAUGE,
        "stores",
        _CARD,
        "Store sequence numbers left of the index's 46 bits; once spent every store is refused (NoSpace) until the "
        "card is reformatted. An open that leaves fewer than 2^42 logs a WARNING (docs/card_format.md, Recovery, "
        '"A region header not walked")',
    ),
    Stat(
        "recovery_seq_margin",
        GAUGE,
        "stores",
        _CARD,
        "Sequence numbers the card's open skipped (2^32, or the card's blocks if more) because a pad or region "
        "header it had to write failed and a block behind it could not be read: 0 unless so; each such open spends "
        "that much of store_seqs_left",
    ),
    Stat(
        "process_loads",
        COUNTER,
        "objects",
        _PROCESS,
        "Objects the gateway wrote straight into process memory: this client's (client), all clients' (gateway)",
    ),
    Stat(
        "process_stores",
        COUNTER,
        "objects",
        _PROCESS,
        "Objects the gateway stored straight from process memory: this client's (client), all clients' (gateway)",
    ),
    Stat(
        "process_stores_over_limit",
        COUNTER,
        "objects",
        C,
        "Objects sent through the ring though process stores were granted: their batch held one larger than "
        "the gateway's store buffer (protocol r6)",
    ),
    Stat(
        "healthy",
        GAUGE,
        "1 or 0",
        _CARD,
        "0 from the card's first I/O error until an I/O succeeds 10 s or more after its last error "
        "(kFailingHold: I/O failing and working interleaved reads 0 throughout; the episode is logged once at "
        "its start and once at its end, with its error count). /health answers 503 at 0",
    ),
)
CARD_LIST_DEFAULTS: dict[str, int | bool] = {s.name: s.name == "healthy" or 0 for s in CARD_LIST}  # StoreStats' own

# A connector on a gateway's own (src_cpp/transport/remote_backend.cc, RemoteBackend::stats; in its stats
# dict only, added by src_cpp/python/bindings.cc).
CLIENT_STATS: tuple[Stat, ...] = (
    Stat(
        "gateway_reachable",
        GAUGE,
        "1 or 0",
        C,
        "1 while the connector's last attempt to reach its gateway succeeded (also before the first attempt ended: "
        "a connect is made as the connector starts, in the background, on a thread of its own); "
        "0 from a failed connect or a dropped connection until the next connect succeeds (not from that start-up "
        "connect's failure once a batch's own connect succeeded after it began): loads miss and stores "
        "are dropped meanwhile (/health answers 503 at 0). With no traffic the connector reconnects in the "
        "background meanwhile (every 2 s at the longest), so it turns 1 within 2 s of the gateway's return "
        "without a batch; and an idle connector whose gateway closed all its connections connects once to "
        "tell a gateway gone (0 within 2 s of its stop; a gateway that is hung rather than stopped, one that "
        "accepts and does not answer: within about 1 s plus adapter_params `connect_timeout_ms`, 2000 ms by "
        "default) from one closing idle connections (stays 1)",
    ),
    Stat(
        "gateway_token_refused",
        GAUGE,
        "1 or 0",
        C,
        "1 while the gateway's answer to the connector's last connect was a refused token (TCP: "
        "adapter_params token_file does not hold the token of the gateway's --token-file), until a connect "
        "succeeds; gateway_reachable is 0 meanwhile. It does not heal by itself: fix token_file and restart the "
        "process. Logged once at ERROR; the connector tries again at most every 2 s, in the background while "
        "idle (/health answers 503 at 1, saying so)",
    ),
    Stat(
        "gateway_reconnects",
        COUNTER,
        "connections",
        C,
        "Connections to its gateway the connector's workers made again after losing theirs (a gateway restart "
        "costs one per worker that had a connection; each connects again at its next batch, the first one "
        "taking the connection the background reconnect made while the connector was idle, if any: counted "
        "once, when a worker takes it)",
    ),
    Stat(
        "gateway_stalled",
        GAUGE,
        "1 or 0",
        C,
        "1 once a request has waited gateway_stall_s (adapter_params, 5 s by default) with nothing heard from "
        "the gateway on any of the connector's connections since it was sent (a hung or stopped gateway: the "
        "connection is open but silent), until the gateway is next heard from (a reply, its bytes as they come, a "
        "request's bytes the socket takes once it was full (none that a socket buffer takes at once: those say "
        "nothing of the gateway, session 32), a published piece, a "
        "new connection's handshake, or, on a ring with a control page, the gateway's alive word moving, over "
        "TCP an alive frame (r8): both come per item or chunk finished and while a request waits for an I/O "
        "context or store-buffer room with what it waits for moving meanwhile (a context given back or card "
        "work done under one; for room also room given back or a process store's read of its client's memory), "
        "so a slow or busy but working gateway is not stalled and one hung in card I/O is, whatever other "
        "traffic it has; from a gateway "
        "older than r8 over TCP, or on a ring without a control page, only replies count, and a request the "
        "gateway takes gateway_stall_s over reads stalled); an idle connector is never stalled (nothing is "
        "sent to find out). Logged "
        "(WARNING) when it starts, by the waiting request itself, at most once a minute (the next WARNING says how "
        "many stalls were not logged and how long they lasted in all), and its end (INFO, with how long it "
        "lasted) when its start was logged. Requests fail by their deadlines meanwhile "
        "(/health answers 503 at 1)",
    ),
    Stat(
        "gateway_card_healthy",
        GAUGE,
        "1 or 0",
        C,
        "0 from a load or store the gateway answered with an I/O error of its card (the message: "
        '`gateway_card_error`; not the I/O-error answers about the gateway\'s own memory, "out of memory ...", '
        "nor its process_vm_readv/writev of the client's memory, \"process_vm_...\": told by the error's class "
        "from a gateway of protocol r9 or later, by those starts of the message from an older one) until one of the connector's loads hits or stores succeeds 10 s or more after the last such error "
        "(kFailingHold, as the gateway's own `healthy`: failing and working items interleaved read 0 throughout, "
        "one WARNING at the start and one INFO with the error count at the end); the gateway's own "
        "`healthy` is its card's every I/O (/health answers 503 at 0)",
    ),
)

# The gateway's own (src_cpp/gateway/stats_json.cc).
GATEWAY_STATS: tuple[Stat, ...] = (
    Stat(
        "clients",
        GAUGE,
        "connections",
        G,
        "Connections past the handshake, status queries not counted (protocol r10: `lmcache-adp status --gateway`; "
        "one of an older status command is counted). A client is counted before its HelloOk is sent, so a stats "
        "read it makes once it has its HelloOk counts it (until session nineteen counted just after, and a read "
        "made at once could miss it)",
    ),
    Stat(
        "status_queries",
        COUNTER,
        "connections",
        G,
        "Status queries that asked for the stats, since start (`lmcache-adp status --gateway`, protocol r10); each "
        "logged at DEBUG, not in clients. Idle connectors' probes are not among them: status_probes",
    ),
    Stat(
        "status_probes",
        COUNTER,
        "connections",
        G,
        "Status queries that closed after their handshake, asking nothing, since start: a connector whose "
        "connections this gateway closed for idleness (--idle-timeout-s) asks one a second to see the gateway is "
        "up (docs/protocol.md, Failure and reconnection); each logged at DEBUG, not in clients nor status_queries",
    ),
    Stat(
        "usable_cpus",
        GAUGE,
        "CPUs",
        G,
        "The CPUs the gateway's rules count (--request-spin-us's load rule, the piece helpers, the store pipeline): "
        "sched_getaffinity's count, or a container's cgroup CPU quota rounded up where fewer; also in its start line",
    ),
    Stat("batches", COUNTER, "batches", G, "Batches served since start"),
    Stat("batch_puts", COUNTER, "batches", G, "Put (store) batches answered"),
    Stat(
        "batch_put_ns",
        COUNTER,
        "nanoseconds",
        G,
        "Time connections spent on put batches, from the request read to its reply ready to send: a client's time "
        "per request beyond batch_put_ns / batch_puts is the round trip (sockets, wake-ups)",
    ),
    Stat("batch_gets", COUNTER, "batches", G, "Get (load) batches answered"),
    Stat(
        "batch_get_ns",
        COUNTER,
        "nanoseconds",
        G,
        "Time connections spent on get batches, from the request read to its reply ready to send (as batch_put_ns)",
    ),
    Stat(
        "batch_spins",
        COUNTER,
        "waits",
        G,
        "Waits for a next request begun awake after a put or get (--request-spin-us, while CPUs are idle)",
    ),
    Stat(
        "batch_spin_hits",
        COUNTER,
        "waits",
        G,
        "Of batch_spins, those the next request ended (the connection's thread never slept for it)",
    ),
    Stat(
        "refused_connections",
        COUNTER,
        "connections",
        G,
        "Connections refused by a limit (README, Gateway limits), status queries refused at their Hello not counted "
        "(refused_status_queries). Those refused before their Hello, not known to be clients yet, are counted: "
        "TCP connections past --max-handshakes, and local ones past --max-clients and the 2 of the status-query "
        "reserve (an idle connector's probe among them only when that reserve is taken)",
    ),
    Stat(
        "accept_backoffs",
        COUNTER,
        "pauses",
        G,
        "Pauses of the gateway's accept thread after an accept failed for want of descriptors (EMFILE: its "
        "RLIMIT_NOFILE; ENFILE) or kernel memory, the connection left waiting in the listen backlog: the listening "
        "sockets are polled again after 100 ms, doubling to 1 s while it goes on (one WARNING an episode; session 33: "
        "they were polled again at once, a full CPU)",
    ),
    Stat(
        "failed_connections",
        COUNTER,
        "connections",
        G,
        "Connections the gateway ended because serving them threw (no memory: std::bad_alloc, say), each logged at "
        "ERROR with its peer and the reason; their counts and registrations given back, the other connections "
        "served on (session 25)",
    ),
    Stat(
        "store_reader_failures",
        COUNTER,
        "stores",
        G,
        "Process stores (or chunks of them) that failed because a connection's store reader threw while reading "
        "them from the client's memory (no memory: std::bad_alloc, say), each logged at ERROR with the reason and "
        "answered with it; the reader and the connection go on (session 26)",
    ),
    Stat(
        "refused_status_queries",
        COUNTER,
        "connections",
        G,
        "Status queries refused at their Hello for being full (--max-tcp-clients and the 2 past it kept for status "
        "queries, protocol r15: over TCP a status query takes a slot), since start: mostly idle connectors' probes (one a second each while the gateway holds their "
        "connections closed, status_probes), which read a refusal for being full as an answer; also "
        "`lmcache-adp status --gateway tcp://...`. Not in refused_connections: a gateway full of clients that "
        "idle connectors probe turns no client away (a local status query is never refused at its Hello)",
    ),
    Stat(
        "ring_bytes",
        GAUGE,
        "bytes",
        G,
        "Bytes of the connected clients' shared-memory rings: their payload areas (protocol r12: a ring's 4 KiB "
        "control page is not counted)",
    ),
    Stat("ring_used_bytes", GAUGE, "bytes", G, "Payload bytes of batches in progress in those rings"),
    Stat("ring_piece_loads", COUNTER, "objects", G, "Objects loaded into a ring in published pieces (protocol r4)"),
    Stat("segments", GAUGE, "segments", G, "Client segments (/dev/shm files) mapped (protocol r3)"),
    Stat(
        "segment_bytes",
        GAUGE,
        "bytes",
        G,
        "Address space of the client segments mapped (their files' whole sizes, a file shared by connections counted "
        "once), within --max-segment-total-gb: a registration past it is refused for now (protocol r19)",
    ),
    Stat("segment_loads", COUNTER, "objects", G, "Objects read straight into a client segment"),
    Stat(
        "segment_populates",
        COUNTER,
        "calls",
        G,
        "Page-table setups (MADV_POPULATE_WRITE) of client segment pages before a load into them: once per page, "
        "so it stops growing once a client's load buffers were each loaded into",
    ),
    Stat(
        "segment_prefault_bytes",
        COUNTER,
        "bytes",
        G,
        "Client segment bytes whose page tables the gateway populated in the background after their registration "
        "(--segment-prefault on: the pages the segment's file held, not populated by a load before), so that "
        "loads into them make no MADV_POPULATE_WRITE (segment_populates does not move). Only segments on a memory "
        "filesystem (tmpfs, hugetlbfs): a disk-backed file's pages are left to its loads",
    ),
    Stat(
        "segment_prefault_ns",
        COUNTER,
        "nanoseconds",
        G,
        "Wall time of the gateway's background populate of segment pages (its MADV_POPULATE_WRITE calls, on its "
        "own thread adp-segpopulate: what it cost in CPU, about)",
    ),
    Stat(
        "segment_prefaults",
        COUNTER,
        "segments",
        G,
        "Client segments whose written pages the background populate went over to the end (one a file: "
        "connections registering the same file share its mapping)",
    ),
    Stat(
        "segment_prefault_pending",
        GAUGE,
        "segments",
        G,
        "Client segments queued for the background populate or being gone over now; 0 once each added was "
        "finished with (done, let go, or refused by the kernel)",
    ),
    Stat("segment_stores", COUNTER, "objects", G, "Objects stored straight from a client segment"),
    Stat("processes", GAUGE, "connections", G, "Connections granted process memory (protocol r5)"),
    Stat(
        "process_refusals",
        COUNTER,
        "connections",
        G,
        "Process-memory registrations refused (the client then uses the ring; logged once with the reason)",
    ),
    Stat("process_read_bytes", COUNTER, "bytes", G, "Bytes read from clients' process memory for stores"),
    Stat(
        "process_store_read_ns",
        COUNTER,
        "nanoseconds",
        G,
        "Connection threads' wall time reading process stores' chunks from clients' memory into the store buffer "
        "(their helpers' pieces included); of a pipelined store (process_store_pipelined), only the wait for "
        "its read after its card store ended; of an overlapped chunk (process_store_overlapped), only the waits "
        "for its store reader (the reads beside its puts are not counted)",
    ),
    Stat(
        "process_store_put_ns",
        COUNTER,
        "nanoseconds",
        G,
        "Connection threads' wall time storing those chunks from the store buffer into the card (copy with CRC, "
        "the frontier's order, the sync); of a pipelined store, its card store with the read it overlapped",
    ),
    Stat(
        "process_store_pipelined",
        COUNTER,
        "objects",
        G,
        "Process stores of one large object (>= 8 MiB, a memory-speed card) copied into the card piece by piece "
        "while the connection's store reader read them",
    ),
    Stat(
        "process_store_overlapped",
        COUNTER,
        "objects",
        G,
        "Process stores put into the card as soon as the connection's store reader had read them whole, beside "
        "the read of the chunk's next objects (a chunk of two or more process objects on a memory-speed card, "
        "while a CPU is spare beside each connection; off unless the gateway runs with ADP_STORE_CHUNK_OVERLAP=1)",
    ),
    Stat(
        "process_store_stalls",
        COUNTER,
        "objects",
        G,
        "Such stores whose read fell behind (a piece over 200 ms, or the object over 200 ms plus its bytes at "
        "512 MiB/s): their card place abandoned (a pad record, not a store failure), then stored from the buffer; "
        "that connection pipelines again 30 s later",
    ),
    Stat(
        "process_store_unpipelined_busy",
        COUNTER,
        "objects",
        G,
        "Process stores of one large object that would have been pipelined but went through the buffer: the "
        "connections storing and loading left no spare CPU for a store reader beside each (CPUs / connections "
        "< 2, the piece helpers' rule; read on the connection's thread alone), or --max-pipelined-stores "
        "(io_contexts / 2 by default) pipelined stores were running when its first piece was read (read whole "
        "by its reader, then stored). Not counted (in no counter): a connection's large stores in the 30 s "
        "after one of its stores stalled (process_store_stalls) or its store reader thread could not start; so "
        "pipelined + unpipelined_busy is not every large store",
    ),
    Stat("process_write_threads", GAUGE, "threads", G, "Helper threads of the piece pool (--process-write-threads)"),
    Stat(
        "process_helper_pieces",
        COUNTER,
        "pieces",
        G,
        "Pieces of process loads and stores the helpers took (failed and stopped ones included)",
    ),
    Stat(
        "process_piece_callers",
        GAUGE,
        "connections",
        G,
        "Connections counted as moving process-memory pieces now: a loader from its first process load until "
        "it idles 20 ms, a storer for its put batch (an object takes at most CPUs / this - 1 helpers)",
    ),
    Stat(
        "store_buffer_bytes",
        GAUGE,
        "bytes",
        G,
        "Bytes the connections' store buffers hold (within --max-store-buffer-total-mb)",
    ),
    Stat(
        "store_buffer_busy",
        COUNTER,
        "chunks",
        G,
        "Store chunks failed Busy: no store-buffer room came free before their deadline",
    ),
    Stat("store_buffer_waiting", GAUGE, "connections", G, "Connections waiting for store-buffer room"),
    Stat(
        "load_hold_bytes",
        GAUGE,
        "bytes",
        G,
        "Bytes the connections keep of their last process load from a card that is not memory-speed (reserved "
        "before the read, within --max-store-buffer-total-mb apart from the store buffers)",
    ),
    Stat(
        "load_hold_busy",
        COUNTER,
        "loads",
        G,
        "Process loads from a card that is not memory-speed failed Busy: no room for their buffer within "
        "--max-store-buffer-total-mb",
    ),
    Stat(
        "load_profile_{step}_ns",
        COUNTER,
        "nanoseconds",
        G,
        "Time the gateway's process loads (seg_* steps: segment loads) spent in this step, summed over threads "
        "(benchmarks)",
        only_with="ADP_LOAD_PROFILE=1",
        metric_name="load_profile_ns",
    ),
    Stat(
        "load_profile_{step}_n",
        COUNTER,
        "runs",
        G,
        "Times the gateway's process loads (seg_* steps: segment loads) ran this step (benchmarks)",
        only_with="ADP_LOAD_PROFILE=1",
        metric_name="load_profile_runs",
    ),
)


def _request_timing() -> tuple[Stat, ...]:
    """A connector's per-request timing (src_cpp/connector/connector.h, OpTiming): for store (put) and load
    (get) batches alike, sums in nanoseconds plus counts, per worker slice (a batch is split into one slice per
    worker, at most). worker_*: every connector; gateway_*: one on a gateway, its requests' edges (a slice
    sends one request on the segments and process paths, one per round through the ring)."""
    out = []
    for op, what in (("put", "store"), ("get", "load")):
        w, g = f"worker_{op}", f"gateway_{op}"
        out += [
            Stat(
                f"{w}_slices",
                COUNTER,
                "slices",
                E | C,
                f"Slices of {what} batches the connector's workers ran (each counted, with its times, once its worker is done "
                "with it: after its batch's completion was signalled, so a stats read right after a completion may "
                "not have that batch's last slice yet)",
            ),
            Stat(
                f"{w}_queue_ns",
                COUNTER,
                "nanoseconds",
                E | C,
                "Of those slices, from the batch's submit to a "
                "worker taking the slice (with batches in flight, mostly the wait behind the slices before it)",
            ),
            Stat(
                f"{w}_pickup_ns",
                COUNTER,
                "nanoseconds",
                E | C,
                "Of those slices, from when the slice could be taken (its batch's submit, or the worker's previous "
                "slice done if later"
                + (
                    "; a slice a run took late, worker_put_late_slices: its run's writes done, if later"
                    if op == "put"
                    else ""
                )
                + ") to taken: the queue's hand-off to a worker (an idle worker's wake-up), not "
                "the worker's idle time waiting for a submit nor a slice's wait for its worker's run",
            ),
            Stat(
                f"{w}_run_ns",
                COUNTER,
                "nanoseconds",
                E | C,
                "Of those slices, from taken to the backend's call "
                "returned (the card's work embedded; through a gateway, gateway_*_setup + round trip + finish)",
            ),
            Stat(
                f"{w}_done_ns",
                COUNTER,
                "nanoseconds",
                E | C,
                "Of those slices, from the call returned to the "
                "worker done with the slice: for a batch's last slice its completion queued and the eventfd "
                "written (the completion hand-off)",
            ),
            Stat(
                f"{w}_batches",
                COUNTER,
                "batches",
                E | C,
                f"{what.capitalize()} batches completed by their workers (not by their deadline nor by close)",
            ),
            Stat(
                f"{w}_batch_ns",
                COUNTER,
                "nanoseconds",
                E | C,
                "Of those batches, from submit to their last "
                "slice done (the eventfd written): queue + run + done of that slice",
            ),
            Stat(
                f"{g}_slices",
                COUNTER,
                "slices",
                C,
                f"Slices of {what} batches that sent a request to the gateway and read its reply",
            ),
            Stat(
                f"{g}_setup_ns",
                COUNTER,
                "nanoseconds",
                C,
                "Of those slices, from a worker taking the slice to "
                "its first request about to be written (finding the buffers' segments, the request's encoding)",
            ),
            Stat(
                f"{g}_requests",
                COUNTER,
                "requests",
                C,
                f"{what.capitalize()} requests whose reply was read "
                "(the gateway counts them as batch_puts / batch_gets)",
            ),
            Stat(
                f"{g}_round_trip_ns",
                COUNTER,
                "nanoseconds",
                C,
                "Of those requests, from its write to its reply "
                "read: the gateway's own time (batch_put_ns / batch_get_ns) plus the sockets and both sides' "
                "wake-ups (and, for a ring load in pieces, the copies out of the ring meanwhile)",
            ),
            Stat(
                f"{g}_finish_ns",
                COUNTER,
                "nanoseconds",
                C,
                "Of those slices, from the last reply read to the "
                "call returned (the lease revoked, the items' results noted)",
            ),
            Stat(
                f"{g}_reply_spins",
                COUNTER,
                "waits",
                C,
                f"{what.capitalize()} requests whose wait for the reply polled the socket without sleeping "
                "(adapter_params reply_spin_us: the worker slept to shortly before the round trip expected and the "
                "reply had not come by then; a reply there before that is not counted). Only while CPUs are idle "
                "and the worker's spins of this op catch their replies: once fewer than 4 of its last 16 did, 1 "
                "wait in 16 (a probe, which resumes them when it catches its reply). A ring load in pieces never "
                "spins (its reply is read after the pieces)",
            ),
            Stat(
                f"{g}_reply_spin_hits",
                COUNTER,
                "waits",
                C,
                "Of those, the ones whose reply came while the worker polled (no wake-up in its round trip)",
            ),
        ]
        if op == "put":
            out += [
                Stat(
                    f"{w}_runs",
                    COUNTER,
                    "runs",
                    E | C,
                    "Runs of store slices the connector's workers made: the slices a worker took together (on an "
                    "embedded durable card, those queued behind one another, up to 16 MiB), stored by one backend "
                    "call; on an embedded durable card each makes at most one fdatasync, so worker_put_slices / "
                    "worker_put_runs is the store slices a sync",
                ),
                Stat(
                    f"{w}_late_slices",
                    COUNTER,
                    "slices",
                    E | C,
                    "Of worker_put_slices, those a run took once its first slices were written, before its sync "
                    "(an embedded durable card: the slices queued by then, written and made durable by that sync "
                    "instead of waiting for a run and a sync of their own); their queue and pickup times end when "
                    "they were taken, their pickup counts from their run's writes done (or their submit, if later)",
                ),
            ]
    return tuple(out)


REQUEST_TIMING: tuple[Stat, ...] = _request_timing()

STATS: tuple[Stat, ...] = CARD_LIST + CLIENT_STATS + REQUEST_TIMING + GATEWAY_STATS
BY_KEY: dict[str, Stat] = {k: s for s in STATS for k in s.keys()}


def expected_keys(source: str, *, load_profile: bool = False) -> set[str]:
    """The numeric keys a source's stats carry: what it reports, plus the card's list."""
    out = set(CARD_LIST_DEFAULTS)
    for s in STATS:
        if source in s.reported_by and (load_profile or not s.only_with):
            out.update(s.keys())
    return out


def render_markdown() -> str:
    """docs/stats.md, from the table above."""
    lines = [
        f"# Stats (stats v{VERSION})",
        "",
        "<!-- Rendered from lmcache_adp/stats_catalog.py: edit the table there, then",
        "     python scripts/render_stats_md.py -->",
        "",
        "Every number lmcache-adp reports, in one table. Read them from a connector's",
        "`stats()`, a gateway's Stats frame (`lmcache-adp status --gateway URL --json`),",
        "`/stats` where a metrics port is open (`lmcache-adp status --url URL --json`),",
        "or Prometheus (`/metrics`).",
        "",
        "**Who reports it**: `embedded` is an ADPConnector on its own card, `client` an",
        "ADPConnector through a gateway, `gateway` the `lmcache-adp gateway` daemon",
        "(`lmcache-adp status --card` reads a card no process holds: the card's list,",
        "as embedded). The card's list (marked *card*) is in every stats dict: where a",
        "source does not report one of its stats, it holds its value before any event",
        "(0, `healthy` true): ask the gateway for its card's.",
        "",
        "**Prometheus** (`/metrics`): each source serves the stats it reports, not the",
        "card's list's first values (a client serves no `lmcache_adp_capacity_bytes`).",
        "The family is `lmcache_adp_` and the name; a counter's samples end in `_total`;",
        "nanoseconds are served as seconds (`_ns` becomes `_seconds`); `healthy` is 1",
        "or 0. The load profile's keys are two families with a `step` label, one value",
        "per step. No other labels: a fleet's series are told apart by the scrape's",
        "own `instance` and `job`.",
        "",
        "**Counted twice**: `hits`, `misses`, `lookup_hits`, `lookup_misses`, `stores`,",
        "`store_failures`, `deletes`, `bytes_written`, `bytes_read`, `process_loads` and",
        "`process_stores` are counted",
        "both by a connector on a gateway (its own operations) and by the gateway",
        "itself (all its clients'): a fleet's sum over every scrape counts each such",
        "operation twice, so filter by `job` (sum the gateways' or the connectors',",
        "never both).",
        "",
        "**Versions**: a name is never reused with another meaning. A new stat adds a",
        "row and keeps the version; removing or renaming one bumps it, and the old",
        "name is listed under Retired names.",
        "",
        "| stat | kind | unit | reported by | Prometheus | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in STATS:
        who = ", ".join(src for src in SOURCES if src in s.reported_by)
        if s.name in CARD_LIST_DEFAULTS:
            who += " (*card*)"
        metric = s.metric + ("_total" if s.kind == COUNTER else "")
        if s.labels:
            metric += "{" + ",".join(s.labels) + "}"
        meaning = s.meaning + (f"; only with `{s.only_with}`" if s.only_with else "")
        lines.append(f"| `{s.name}` | {s.kind} | {s.unit} | {who} | `{metric}` | {meaning} |")
    lines += [
        "",
        "Load-profile steps (`{step}` above; src_cpp/util/load_profile.h says what each one times): "
        + ", ".join(f"`{s}`" for s in LOAD_PROFILE_STEPS)
        + ".",
        "",
        "## Watching a fleet",
        "",
        "A few expressions to start from (PromQL; scrape the gateways, and the",
        "connectors' `metrics_port`):",
        "",
        "| what | expression |",
        "|---|---|",
        "| card I/O failing (page) | `lmcache_adp_healthy == 0` |",
        "| a connector lost its gateway (page; every load a miss, every store dropped) | "
        "`lmcache_adp_gateway_reachable == 0` |",
        "| a connector's token refused by its TCP gateway (fix token_file, restart) | "
        "`lmcache_adp_gateway_token_refused == 1` |",
        "| a connector's gateway hung, or a request waiting gateway_stall_s on a gateway heard from only by its "
        "replies (TCP before r8): "
        "requests fail by their deadlines | `lmcache_adp_gateway_stalled == 1` |",
        "| a gateway's card failing, as its connectors see it | `lmcache_adp_gateway_card_healthy == 0` |",
        "| a connector's gateway flapping | `increase(lmcache_adp_gateway_reconnects_total[1h]) > 3` |",
        "| hit ratio a card is sized by: keys LMCache's lookups found on the card (evicted keys are misses) | "
        "`rate(lmcache_adp_lookup_hits_total[5m]) / (rate(lmcache_adp_lookup_hits_total[5m]) + "
        "rate(lmcache_adp_lookup_misses_total[5m]))` |",
        "| loads served of those tried (not prompts found: an evicted key is never loaded, so never a miss; "
        "use the lookup ratio above to size a card) | `rate(lmcache_adp_hits_total[5m]) / "
        "(rate(lmcache_adp_hits_total[5m]) + rate(lmcache_adp_misses_total[5m]))` |",
        "| damaged objects dropped | `increase(lmcache_adp_checksum_failures_total[1h]) > 0` |",
        "| damage found on a card at its open (each region in an ERROR line; `lmcache-adp verify`) | "
        "`lmcache_adp_recovery_damaged_regions > 0` |",
        "| a card nearing the end of its store sequence numbers (then every store is refused until it is "
        "reformatted) | `lmcache_adp_store_seqs_left < 4398046511104` (2^42) |",
        "| the host short of memory for loads and stores (not the card) | "
        "`rate(lmcache_adp_memory_failures_total[5m]) > 0` |",
        "| card fill | `lmcache_adp_used_bytes / lmcache_adp_capacity_bytes` |",
        "| eviction churn (objects/s) | `rate(lmcache_adp_evicted_objects_total[5m])` |",
        "| stores failing | `rate(lmcache_adp_store_failures_total[5m]) > 0` |",
        "| store buffers too small (`--max-store-buffer-total-mb`) | "
        "`rate(lmcache_adp_store_buffer_busy_total[5m]) > 0` or `lmcache_adp_store_buffer_waiting > 0` |",
        "| clients turned away by a limit | `rate(lmcache_adp_refused_connections_total[5m]) > 0` |",
        "| clients on the ring instead of process memory | `lmcache_adp_process_refusals_total > 0` |",
        "| load latency p99 (connectors: embedded or client, with a metrics_port) | `histogram_quantile(0.99, sum by (le) "
        '(rate(lmcache_adp_op_latency_seconds_bucket{op="get"}[5m])))` |',
        "",
        "## Not in the table",
        "",
        "| key | why |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {why} |" for k, why in NOT_NUMERIC.items()]
    lines += ["", "## Retired names", ""]
    lines += [f"- `{k}` (last in stats v{v})" for k, v in RETIRED.items()] or ["None yet."]
    return "\n".join(lines) + "\n"
