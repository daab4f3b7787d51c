# SPDX-License-Identifier: Apache-2.0
"""lmcache-adp native core (src_cpp/python/bindings.cc): card store, connector, gateway.

Type stubs for IDEs and readers; tests/util/test_native_stub.py checks that
every name here exists in the built module and that the module has no public
name missing here.
"""

from collections.abc import Callable
from typing import Any, overload

from typing_extensions import Buffer

# The card format and the gateway protocol (src_cpp/store, src_cpp/protocol/frame.h).
FORMAT_VERSION: int
SOURCE_DIGEST: str  # sha256 of the src_cpp sources built (lmcache_adp/source_digest.py); "" outside setup.py
MAX_KEY_BYTES: int
PROTOCOL_VERSION: int
FRAME_MAGIC: int
SEGMENT_RETRY_LATER: str  # r19: a segment registration refused for now starts its reason with this
FRAME_HEADER_BYTES: int
FRAME_TYPES: dict[
    str, int
]  # HELLO, HELLO_OK, BATCH, BATCH_REPLY, ERROR, STATS, STATS_REPLY, REGISTER_SEGMENT, SEGMENT_OK, REGISTER_PROCESS, PROCESS_OK, ALIVE
OPS: dict[str, int]  # PUT, GET, EXISTS, DELETE
FEATURE_RING: int
FEATURE_SEGMENTS: int
FEATURE_RING_PROGRESS: int
FEATURE_PROCESS_LOADS: int
FEATURE_PROCESS_STORES: int
FEATURE_STORE_LIMIT: int
FEATURE_ALIVE: int  # r8: alive frames over TCP
FEATURE_ERROR_CLASS: int  # r9: each I/O error's class in its reply item
FEATURE_STATUS_QUERY: int  # r10: a status query, not a client
PROCESS_SEGMENT: int
MAX_SEGMENTS: int
MAX_BATCH_KEYS: int
MAX_TOKEN_BYTES: int
MAX_NAME_BYTES: int
MAX_MESSAGE_BYTES: int
MAX_STATS_BYTES: int
MAX_INLINE_PAYLOAD_BYTES: int
MIN_RING_BYTES: int
MAX_RING_BYTES: int
MAX_FRAME_BODY_BYTES: int
MAX_HELLO_BODY_BYTES: int
# GatewayServer's options refused outside these ranges (ValueError), name -> (min, max) inclusive; `lmcache-adp
# gateway` checks and states its flags' ranges from here (src_cpp/gateway/gateway_server.h, kGatewayOptionRanges).
GATEWAY_OPTION_RANGES: dict[str, tuple[int, int]]

def crc32c(data: Buffer, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of data, continuing from crc (0 to start)."""

def crc32c_implementation() -> str:
    """Which CRC32C code runs on this CPU (a hardware one, or "bitwise")."""

# crc32c_implementation() names the CPU's best ("vpclmulqdq" (AVX-512), "vpclmulqdq-avx2", "pclmul", "sse4.2",
# "armv8", "bitwise"). Every other one this CPU runs is checked by forcing it by name, in C++ only (no binding):
# adp::crc32c_extend_by (src_cpp/util/crc32c.h), from tests/cpp/crc32c_paths_test.cc (tests/util/test_crc32c.py).

def known_test_hooks() -> list[str]:
    """The ADP_TEST_* hooks the gateway and the connector read."""

def format_card(path: str, create_bytes: int = 0, region_bytes: int = 0, preallocate: bool = False) -> None:
    """Writes a new superblock on path (creating an image of create_bytes if it
    does not exist: sparse; its blocks allocated with preallocate=True, except on tmpfs):
    every object on the card becomes unreadable. region_bytes 0 picks the
    default. Raises RuntimeError on failure."""

def card_image_space(path: str) -> tuple[int, int, int] | None:
    """(size, allocated, free) bytes of the card image file at path: its size, what its filesystem allocated to it
    (st_blocks x 512; less than its size while it is sparse) and that filesystem's free bytes (f_bavail x
    f_frsize; a symlink is followed). None for a block device or a path that cannot be looked at."""

def card_space_warning(path: str) -> str | None:
    """The WARNING for an existing card image whose filesystem cannot hold what it can still grow by (its size less
    its allocated bytes), alone or with the other card images in its directory; None when it fits, for a block
    device, or a path that cannot be looked at (docs/card_format.md, "Free space")."""

def parse_frame(frame: bytes, /) -> None:
    """Checks one whole protocol frame as the gateway would; ValueError says why it is refused."""

class NativeConnector:
    """The LMCache native-connector interface over the card (embedded) or a
    gateway: futures are submitted, completions are drained after event_fd()
    becomes readable. ADPConnector (lmcache_adp.connector) is the class
    LMCache builds; it subclasses this one."""

    @overload
    def __init__(self, config: dict[str, Any], /) -> None:
        """config: ConnectorConfig.to_native() (backend, card or gateway, workers, timeout_ms, ...)."""

    @overload
    def __init__(self) -> None:
        """An empty connector (cannot raise): _start(config) builds it (ADPConnector's way: an object whose
        start raised exists, in the traceback's frames); until then each method raises RuntimeError ("this
        connector failed to start: ...") and close() does nothing. _start_failed(why) records why, _started()
        says whether it was built."""

    def event_fd(self) -> int:
        """An eventfd that becomes readable when completions are ready to drain."""

    def submit_batch_get(self, keys: list[str], bufs: list[Buffer], /) -> int:
        """Loads each key into its writable buffer (sized to the object); returns the future id.
        A missed key leaves its buffer untouched."""

    def submit_batch_set(self, keys: list[str], bufs: list[Buffer], /) -> int:
        """Stores each buffer under its key; returns the future id. The buffers
        must stay valid and unchanged until the future completes."""

    def submit_batch_exists(self, keys: list[str], /) -> int:
        """Looks the keys up; returns the future id (per-key result: present)."""

    def submit_batch_delete(self, keys: list[str], /) -> int:
        """Deletes the keys; returns the future id (per-key result: not on the card any more; a failed delete is false and fails the future)."""

    def drain_completions(self) -> list[tuple[int, bool, str, list[bool]]]:
        """Completed futures since the last call: (future id, ok, error, per-key results)."""

    def close(self) -> None:
        """Fails what is still pending ("connector closed"), stops the workers, closes the backend."""

    def stats(self) -> dict[str, Any]:
        """The backend's counters (objects, bytes, hits, misses, evictions, errors, ...)."""

    def describe(self) -> str:
        """One line naming the backend (embedded card path or gateway URL)."""

class CardStore:
    """The card store used directly (tools and tests): one object per key,
    synchronous, one caller at a time."""

    def __init__(
        self,
        path: str,
        create_bytes: int = 0,
        durable: bool = True,
        region_bytes: int = 0,
        format_blank: bool = True,
        read_only: bool = False,
        preallocate: bool = False,
        restore_block_zero: bool = False,
    ) -> None:
        """Opens (recovers) the card at path; an image of create_bytes is
        created (sparse; its blocks allocated with preallocate=True, except on tmpfs)
        and formatted if it does not exist, and a blank card (block 0
        all zeros) is formatted unless format_blank is False (then:
        RuntimeError "no card at PATH (block 0 is blank)", nothing written).
        read_only: opened O_RDONLY (still locked against other owners), so a
        card on a read-only filesystem opens; nothing is created, formatted or
        written, and put, remove and verify(repair=True) raise ValueError
        ("... it is open read-only ..."). restore_block_zero (verify --repair only,
        with read_only False): a block 0 of readable bytes that are not a superblock,
        with a valid backup superblock, is rewritten from the backup; without it
        such a card is refused (ValueError "block 0 is not an ADP superblock ...",
        nothing written). Raises RuntimeError."""

    @property
    def max_object_bytes(self) -> int:
        """The largest object this card holds (one region minus its header room)."""

    @property
    def superblock_rewrite_error(self) -> str:
        """What failed where when this open rewrote a bad copy of the superblock ("writing its backup superblock
        (4096 bytes at offset 1044480) failed: ..."); "" where none failed."""

    def put(self, key: str, data: Buffer, /) -> bool:
        """Stores data under key (replacing an older copy); True, or RuntimeError."""

    def get(self, key: str, /) -> bytes | None:
        """The object's bytes, checked against its CRC; None for a miss or a failed check."""

    def exists(self, key: str, /) -> bool:
        """Whether key is in the index."""

    def remove(self, key: str, /) -> bool:
        """Deletes key on the card and from the index; False if it was not there, raises if the delete failed."""

    def stats(self) -> dict[str, Any]:
        """Counters and sizes (objects, used_bytes, capacity_bytes, regions, failures, ...)."""

    def verify(self, repair: bool = False, progress: Callable[[int, int], Any] | None = None) -> dict[str, Any]:
        """Reads every object and checks its CRC; repair=True drops the bad ones
        (ValueError on a read-only card). progress(done, total) is called now and then."""

    def close(self) -> None:
        """Closes the card; the store is unusable afterwards."""

class GatewayServer:
    """The gateway daemon in this process (lmcache-adp gateway runs one)."""

    def __init__(
        self,
        card: str,
        card_size_bytes: int,
        socket_path: str,
        listen: str = "",
        token: str = "",
        io_contexts: int = 4,
        durable: bool = True,
        max_clients: int = ...,
        max_tcp_clients: int = ...,
        max_handshakes: int = ...,
        handshake_timeout_ms: int = ...,
        idle_timeout_ms: int = ...,
        max_ring_bytes: int = ...,
        max_ring_total_bytes: int = ...,
        max_store_buffer_bytes: int = ...,
        process_write_threads: int = -1,
        max_store_buffer_total_bytes: int = ...,
        max_request_timeout_ms: int = ...,
        max_pipelined_stores: int = -1,
        request_spin_us: int = 0,
        segment_prefault: bool = True,
        card_preallocate: bool = False,
        max_segment_total_bytes: int = ...,
    ) -> None:
        """Opens the card (a new image of card_size_bytes: sparse, or its blocks
        allocated with card_preallocate, except on tmpfs) and listens on socket_path (and listen, tcp://HOST:PORT,
        with token); the max_* bounds default to GatewayOptions'. process_write_threads:
        helpers writing process loads' pieces (-1: one per usable CPU, 0: none).
        max_pipelined_stores: large process stores pipelined at once (-1: io_contexts / 2,
        rounded down; 0: none). request_spin_us: how long a connection looks for the
        next request after a put or get before it sleeps, while CPUs are spare (0: never).
        segment_prefault: populate registered segments' written pages in the background
        (False: each load populates its own). max_segment_total_bytes: the client segments mapped together
        (address space; a registration past it is refused for now, protocol r19).
        ValueError for an option outside its range (GATEWAY_OPTION_RANGES): io_contexts 1 to 64,
        process_write_threads -1 to 1024, max_pipelined_stores -1 to 64, request_spin_us 0 to 10000."""

    @property
    def tcp_port(self) -> int:
        """The TCP port listened on (0 without TCP); useful with port 0."""

    @property
    def clients(self) -> int:
        """Connected clients now."""

    def stop(self) -> None:
        """Stops accepting and closes every connection (returns at once)."""

    def wait(self, timeout_s: float) -> bool:
        """Waits for the server to stop; True if it did within timeout_s."""

    def stats(self) -> dict[str, Any]:
        """The gateway's counters and its card's."""

    def stats_json(self) -> str:
        """stats() as one JSON object (what a Stats frame answers)."""

    def close(self) -> None:
        """Stops the server and closes the card."""
