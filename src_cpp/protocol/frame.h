// SPDX-License-Identifier: Apache-2.0
// Gateway protocol, version 1: frame header, message types and every bound
// the parser enforces. The prose spec is docs/protocol.md; keep the two in
// step and bump kProtocolVersion on any incompatible change.
//
//   frame  = FrameHeader (24 bytes) + body (body_bytes)
//   body   = table (fixed fields, item descriptors, keys or texts)
//            + payload (TCP only: object bytes inline; empty with a ring)
//
// All integers are little-endian. Every length and count is checked against
// the bounds below before anything is allocated for it.
#pragma once

#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/store_types.h"
#include "util/status.h"

namespace adp::proto {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

constexpr uint8_t kProtocolVersion = 1;
constexpr uint32_t kFrameMagic = 0x47504441;  // "ADPG" on the wire
constexpr size_t kFrameHeaderBytes = 24;

enum class FrameType : uint8_t {
  kHello = 1,             // client -> gateway, first frame (carries the ring fd on Unix sockets)
  kHelloOk = 2,           // gateway -> client
  kBatch = 3,             // client -> gateway: one batch of one operation
  kBatchReply = 4,        // gateway -> client: per-key results
  kError = 5,             // gateway -> client: why the connection is being closed
  kStats = 6,             // client -> gateway: empty body; asks for the gateway's counters
  kStatsReply = 7,        // gateway -> client: the counters as one JSON object (UTF-8)
  kRegisterSegment = 8,   // client -> gateway: a shared memory file (fd) loads may be written into (r3)
  kSegmentOk = 9,         // gateway -> client: the segment is mapped (r3)
  kRegisterProcess = 10,  // client -> gateway: its pid and a probe of its memory (r5)
  kProcessOk = 11,        // gateway -> client: the process-memory features granted, or why not (r5)
  kAlive = 12,            // gateway -> client: empty body; working on the batch of this request_id (r8)
};

enum class Op : uint8_t { kPut = 1, kGet = 2, kExists = 3, kDelete = 4 };

// Feature bits negotiated in the handshake.
constexpr uint32_t kFeatureRing = 1;      // payload through a shared-memory ring
constexpr uint32_t kFeatureSegments = 2;  // loads written straight into registered client memory (r3; needs the ring)
constexpr uint32_t kFeatureSegmentStores = 4;  // stores read from registered client memory (r3; memory-speed cards)
constexpr uint32_t kFeatureRingProgress = 8;  // a get's bytes published in the ring piece by piece (r4; needs the ring)
constexpr uint32_t kFeatureProcessLoads = 16;   // loads written into the client's process memory (r5; needs the ring)
constexpr uint32_t kFeatureProcessStores = 32;  // stores read from the client's process memory (r5; needs the ring)
constexpr uint32_t kFeatureProcessMemory = kFeatureProcessLoads | kFeatureProcessStores;
// r6: ProcessOk ends with the largest object the gateway reads from process
// memory for a store (its store buffer); larger ones go through the ring.
constexpr uint32_t kFeatureStoreLimit = 64;
// r8: on a connection with no ring (TCP), the gateway sends kAlive frames
// while it works on a batch (at most one per kAliveFrameEvery): the sign of
// life the ring's alive word gives (r7), so gateway_stalled reads a working
// gateway as working over TCP too.
constexpr uint32_t kFeatureAlive = 128;
constexpr std::chrono::milliseconds kAliveFrameEvery{100};
// r9: each I/O error of a BatchReply carries its class (Status::IoClass:
// 1 the card, 2 the gateway's memory, 3 the client's memory) in its item's
// byte 1, zero in r8 and older (and on any other status). Offered by the
// client, granted by a gateway that knows it, on any transport; without it
// that byte stays 0 and the connector tells the card by the message
// (transport/card_io_error.h).
constexpr uint32_t kFeatureErrorClass = 256;
constexpr uint8_t kMaxIoClass = 3;
// r10: the connection is a status query (`lmcache-adp status --gateway`), not
// a client: granted by a gateway that knows it (on any transport), which then
// answers its Stats requests only, logs it at DEBUG and counts it in
// `status_queries`, not in `clients`. Without it a query is a client, as in r9.
constexpr uint32_t kFeatureStatusQuery = 512;
// r11 rule (review r15 N1): a Hello with bit 9 asks for none of bits 0-8
// (a ring, segments, ..., error classes: what a client asks for), else it
// is refused before anything (a ring) is reserved for it.
constexpr uint32_t kClientFeatures = kFeatureStatusQuery - 1;

// Bounds (docs/protocol.md, "Bounds").
constexpr uint32_t kMaxBatchKeys = 4096;
constexpr uint32_t kMaxKeyBytes = adp::kMaxKeyBytes;  // the card's own bound
constexpr uint32_t kMaxTokenBytes = 256;
// The reason of the Error frame a TCP gateway answers a hello with a wrong or
// missing token: the client tells this refusal (it does not heal by itself)
// from the others by it.
constexpr const char* kTokenRefused = "authentication failed: wrong or missing token";
// Words of the other refusals a retry cannot heal, by which the client tells
// them (audit 15 item 18: RemoteBackend::unhealable_fix): a ring larger than
// the gateway allows one connection (--max-ring-mb; gateway/budgets.cc), and
// a frame of another protocol version (check_header, on either side).
constexpr const char* kRingTooLarge = " is larger than this gateway allows per connection (";
constexpr const char* kOtherVersion = "protocol version ";
// The start of the Error frame's reason where a gateway is full (--max-clients local clients, or the status-query
// reserve past them taken, refused at accept; --max-tcp-clients; r14: --max-handshakes TCP connections in their
// handshake, refused at accept, where until r13 the connection was closed with no frame): an answer, so the
// gateway is up; a connector's idle probe (a status query) refused so does not read it as an outage (r13;
// RemoteBackend::full_refusal).
constexpr const char* kTooManyLocalClients = "too many local clients";
constexpr const char* kTooManyTcpClients = "too many TCP clients";
constexpr const char* kTooManyTcpHandshakes = "too many TCP connections in their handshake";
// r19: the start of the Error frame's reason where the gateway refuses a segment registration for its own state,
// not the file's (review33b F5): its segments' address space used up (--max-segment-total-gb), mmap's ENOMEM
// (RLIMIT_AS, vm.max_map_count), the fault handler's table full, no memory. The client registers that file again
// after a back-off; any other refusal of a registration (the file is on FUSE, not a regular file of the stated
// size...) keeps its buffers on the ring for good, as did every refusal until r18.
constexpr const char* kSegmentRetryLater = "segment refused for now, register it again later: ";
constexpr uint32_t kMaxNameBytes = 256;                     // client name, gateway description
constexpr uint32_t kMaxMessageBytes = 256;                  // per-key error text, error frame reason
constexpr uint64_t kMaxObjectBytes = adp::kMaxObjectBytes;  // no card holds a larger object
constexpr uint64_t kMaxInlinePayloadBytes = 64u << 20;      // TCP: payload bytes in one frame
// A ring's payload area (a client's ring_mb), the bounds of ring_area_bytes below.
constexpr uint64_t kMinRingBytes = 1u << 20;
constexpr uint64_t kMaxRingBytes = 4ull << 30;
constexpr uint32_t kMaxHelloBodyBytes = 4096;  // the only size accepted before the handshake
constexpr uint32_t kMaxStatsBytes = 16384;     // a StatsReply body
constexpr uint32_t kMaxSegments = 8;           // segments one connection may register (ids 1..8)
constexpr uint64_t kMaxSegmentBytes = 1ull << 40;
constexpr size_t kRegisterSegmentBytes = 16;
// r5: a batch item whose `segment` is kProcessSegment names the client's own
// process memory; its `offset` is the buffer's virtual address there.
constexpr uint32_t kProcessSegment = 0xFFFFFFFF;
constexpr size_t kRegisterProcessFixedBytes = 16;  // u32 pid, u32 probe_len, u64 probe_addr
constexpr uint32_t kMinProbeBytes = 8;
constexpr uint32_t kMaxProbeBytes = 64;

// r3, with kFeatureSegments: the ring's first 4 KiB are its control page and
// payload starts after it. The page's first 8 bytes are the load lease:
// (request_id << 2) | state. The client opens it before it sends a get into
// segments; the gateway moves it OPEN -> WRITING before each object it writes
// into a segment and back after; the client moves it OPEN -> REVOKED when it
// gives up (deadline, close), waiting out a WRITING first. So no byte lands
// in a client buffer after the client completed its future.
constexpr uint64_t kRingControlBytes = 4096;
// r12: a client maps its ring as its payload area (ring_mb) plus one page for
// the control page, so a batch of objects adding up to ring_mb goes in one
// round whether or not the control page is in use (r11 and older clients
// mapped ring_mb in all, the control page inside it: two 32 MiB objects did
// not fit a 64 MiB ring). Hello's ring_bytes is the mapping's size. The
// gateway accepts a mapping of kMinRingBytes .. kMaxRingBytes plus that page
// and counts ring_area_bytes of it against --max-ring-mb and
// --max-ring-total-mb (an r11 client's ring of exactly ring_mb counts 4 KiB
// less than its ring_mb).
constexpr uint64_t ring_map_bytes(uint64_t area) { return area + kRingControlBytes; }
constexpr uint64_t ring_area_bytes(uint64_t mapped) {
  return mapped > kRingControlBytes ? mapped - kRingControlBytes : mapped;
}
// Whether a ring starts with its control page: segments (r3), ring progress
// (r4) or process memory offered (r5). One rule for both sides (the client's
// GatewayClient::control_page, the gateway's ClientHandler::control_page):
// a drift would have the gateway bump the alive word inside a payload.
constexpr bool has_control_page(bool segments, bool ring_progress, bool process_offered) {
  return segments || ring_progress || process_offered;
}
enum LeaseState : uint64_t { kLeaseOpen = 1, kLeaseWriting = 2, kLeaseRevoked = 3 };
constexpr uint64_t lease_word(uint64_t request_id, uint64_t state) { return request_id << 2 | state; }

// r4, with kFeatureRingProgress (the control page is then reserved too): the
// gateway publishes how far it has written each get item into the ring, so
// the client copies an object out piece by piece while the gateway reads the
// next one in. Words of the control page, all written by one side only:
//   kProgressTicketAt   u32, gateway: bumped after each publish and after
//                       each reply is sent (the client's futex word)
//   kProgressWaitingAt  u32, client: nonzero while it sleeps on the ticket
//                       (the gateway wakes it only then)
//   kProgressSlotsAt    u32 per item of the request, for the first
//                       kProgressSlots items: bytes of the item in the ring
//                       so far (the end of the last piece written). The
//                       client zeroes the request's slots before it sends it.
// The gateway reads only kProgressWaitingAt (whether to FUTEX_WAKE), so a
// client that writes these words can only confuse itself or cost its own
// connection a wake-up per piece;
// the client rejects a slot past its item's size or going back.
constexpr size_t kProgressTicketAt = 64;
constexpr size_t kProgressWaitingAt = 68;
constexpr size_t kProgressSlotsAt = 128;
constexpr size_t kProgressSlots = (kRingControlBytes - kProgressSlotsAt) / 4;

// r7 (any control page: segments, ring progress or process memory): the
// gateway's sign of life while it works on a request.
//   kAliveAt            u32, gateway: bumped (relaxed) after each item or
//                       chunk of a request it finishes (a put's chunk, a
//                       process store's or load's piece, a get's, exists'
//                       or delete's item), not read by it.
//                       The client reads it only as "the gateway is working"
//                       (RemoteBackend::stats: gateway_stalled); a gateway of
//                       r6 or older leaves it 0 (the word was reserved).
constexpr size_t kAliveAt = 72;

constexpr size_t kBatchFixedBytes = 16;
constexpr size_t kBatchItemBytes = 24;
constexpr size_t kReplyFixedBytes = 8;
constexpr size_t kReplyItemBytes = 16;
constexpr uint32_t kMaxTableBytes = kBatchFixedBytes + kMaxBatchKeys * (kBatchItemBytes + kMaxKeyBytes);
static_assert(kReplyFixedBytes + kMaxBatchKeys * (kReplyItemBytes + kMaxMessageBytes) <= kMaxTableBytes);
constexpr uint32_t kMaxFrameBodyBytes = kMaxTableBytes + kMaxInlinePayloadBytes;

struct FrameHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t flags;  // 0 in version 1
  uint32_t body_bytes;
  uint32_t reserved;    // 0 in version 1
  uint64_t request_id;  // client: strictly increasing; reply: the request's id
};
static_assert(sizeof(FrameHeader) == kFrameHeaderBytes, "frame header layout");

FrameHeader make_header(FrameType type, uint64_t request_id, size_t body_bytes);
// Checks magic, version, zero fields, a known type and body_bytes <= max_body.
Status check_header(const FrameHeader& h, uint32_t max_body);

}  // namespace adp::proto
