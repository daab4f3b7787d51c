// SPDX-License-Identifier: Apache-2.0
// What a client of a card sees, whoever serves it (the card store in-process,
// or a gateway over a socket): the items of a store, the delivery callbacks
// of a load, the counters and stats, and the size limits every layer checks.
// The connector and the protocol include this header, never store/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "util/status.h"

namespace adp {

// Size limits. The card format (store/card_format.h) is bound by them.
constexpr uint32_t kMaxKeyBytes = 1024;           // bound on a key, enforced at submit
constexpr uint64_t kMaxObjectBytes = 256u << 20;  // no card holds a larger object (one largest region)

// Validates a key against the bounds above.
inline Status check_key(std::string_view key) {
  if (key.empty()) return Status::InvalidArgument("empty key");
  if (key.size() > kMaxKeyBytes)
    return Status::InvalidArgument("key of " + std::to_string(key.size()) + " bytes exceeds the bound of " +
                                   std::to_string(kMaxKeyBytes) + " bytes");
  return Status::Ok();
}

// Writes the payload's bytes [offset, offset + len) into dst, all of them,
// or fails (the store of that item then fails: see PutItem::fill).
using FillFn = std::function<Status(uint8_t* dst, uint64_t offset, size_t len)>;

// One object of a store: its `size` payload bytes are at `data`, or, when
// `fill` is set (data unused), come from it: the store asks it for each piece
// (256 KiB at most) straight into where the bytes go (the card's mapping on a
// memory-speed card, staging otherwise) and checksums the bytes as they
// landed there, so the CRC matches what is on the card whatever the source
// does meanwhile (a gateway reading a client's memory that the client
// scribbles on). A fill that fails fails that item only: not indexed,
// nothing of it visible, the rest of the batch unaffected; its status is the
// item's result (not counted as a card I/O error, nor in store_failures: the
// source failed, not the store, and its caller answers for it; review r9
// S2: the gateway's pipelined store whose read of the client failed, or
// stalled and was stored from the buffer next). A fill runs while the
// store holds its place on the write frontier (and its caller an I/O
// context): every later store's acknowledgement waits for it, so a source
// that can stall (a client's memory: FUSE, userfaultfd) must not be a fill.
// The gateway's process stores were one until session seven; they now read
// the client into a buffer of the connection's first (docs/protocol.md).
struct PutItem {
  std::string_view key;
  const uint8_t* data;
  size_t size;
  FillFn fill = {};
};

// Places a loaded payload in dst and checks its CRC there; false if it is not
// the intact object (dst may then hold the damaged or other bytes).
using CopyFn = std::function<bool(uint8_t* dst)>;
// Called by get() for an indexed object: chooses where its `size` bytes go
// and calls copy(dst), or declines by returning false.
using DeliverPayloadFn = std::function<bool(size_t size, const CopyFn& copy)>;

// Where get() reads the card into. kStaging: the IoContext's staging memory,
// header and payload checked before deliver() is called; copy() then copies
// into dst while checking the CRC, so dst is written for a memcpy's time.
// kDestination: copy() reads the object with one I/O, payload straight into
// dst (when 4 KiB aligned; staged otherwise), and checks header and CRC in
// place: one pass over the bytes, but dst is written for the card's read
// time. Callers choose it where that time is bounded (a memory-speed card,
// CardStore::memory_speed()) or where dst is memory no one reuses once its
// caller gave up (a gateway connection's ring). kPieces: deliver() only names
// dst (copy(dst) returns true at once); an object of more than 4 MiB
// (kGuardedPieceBytes) into 4 KiB aligned dst from a disk card is then read
// straight into dst in pieces (get()'s piece_bytes), the header block in the
// first piece's request, each read under the PieceGuardFn given to get(), the
// CRC checked piece by piece: one pass over the bytes; the header and key
// are checked after the read (what would make it a miss is ruled out from
// memory before: CardStore::read_and_check). A smaller object, or any into
// unaligned dst, is staged and copied in one piece under it. A memory-speed
// card is copied from its mapping into dst in 1 MiB pieces at any size and
// alignment, the header checked before the first piece (a gateway's ring
// publishes each piece to its client as it lands; one whose mapping failed:
// staged).
// Either way dst is written only while its caller accepts bytes (for a card
// whose read time is not bounded: a disk; or to let a gateway's client copy
// each piece out of the ring while the next one is read).
enum class ReadInto { kStaging, kDestination, kPieces };

// Runs piece() (a bounded read or copy into the caller's buffer) while the
// caller still accepts bytes; returns false without running it once it does
// not (its deadline passed, its future completed). A load in pieces asks
// before each piece, so it stops within one piece of its caller giving up.
// `upto`: once piece() ran, dst[0, upto) holds the payload's first bytes (a
// gateway publishes it to its client, which copies them out meanwhile).
using PieceGuardFn = std::function<bool(size_t upto, const std::function<void()>& piece)>;

// Receives a load's payload piece by piece (CardStore::get_via_bounce): `len`
// bytes at `src` are the payload's bytes [done, done + len). src is valid only
// during the call. False stops the load (it then fails as TimedOut).
using SinkFn = std::function<bool(size_t done, const uint8_t* src, size_t len)>;

struct StoreStats {
  uint64_t capacity_bytes = 0, used_bytes = 0, objects = 0;
  uint64_t region_bytes = 0, num_regions = 0, free_regions = 0;
  uint64_t hits = 0, misses = 0, stores = 0, store_failures = 0, deletes = 0;
  // Keys of lookups (exists) answered found / not found, once per key asked:
  // by the connector (embedded or through a gateway) when a lookup's answer
  // reaches LMCache (a lookup that failed, or timed out, counts in neither:
  // LMCache reads all its keys as misses), and by the gateway per key asked
  // of it. The card store itself never counts them (0 from `status --card`).
  // LMCache loads only the keys its lookup found, so an evicted key is a
  // lookup miss, never a load miss (audit 15 item 9).
  uint64_t lookup_hits = 0, lookup_misses = 0;
  uint64_t evicted_objects = 0, evicted_regions = 0, checksum_failures = 0, io_errors = 0;
  uint64_t media_errors = 0;  // regions with a read that failed at open (their objects past the failed block are lost)
  // The two copies of the superblock at the open (docs/card_format.md, "The backup superblock"): block 0 bad
  // (unreadable, blank, torn, not a superblock, or damaged past its superblock: the card opened with the backup),
  // the backup bad (damaged, unreadable or another superblock than block 0's), and whether the open
  // rewrote the bad copy from the good one (a read-write open; 0 where that write failed). 0 or 1 each.
  uint64_t superblock_block_zero_bad = 0, superblock_backup_bad = 0, superblock_rewritten = 0;
  // The backup's block all zeros at the open, block 0 valid (not superblock_backup_bad): no backup yet, a card
  // formatted by a build before session 39 (a read-write open writes it: superblock_rewritten). 0 or 1.
  uint64_t superblock_backup_blank = 0;
  // Stores that found no region free or evictable (every sealed one pinned by a load or store in flight) and
  // waited for one (up to 5 s, then refused: NoSpace); once a store.
  uint64_t region_waits = 0;
  // Disk stores copied (or filled) and checksummed while the store before them, of the same put, was being written
  // (its write in flight: CardStore::put_each, Linux AIO); 0 where the card's writes are synchronous.
  uint64_t writes_overlapped = 0;
  // Regions retired since the card was opened: the frontier opened each and its header block refused a write (a bad
  // block): never evicted or handed out again until the card is reopened (capacity lost until then).
  uint64_t retired_regions = 0;
  // Card operations (loads, stores, tombstones) that failed for want of this
  // process's own memory (staging, a bounce buffer): not the card's, so not
  // in io_errors.
  uint64_t memory_failures = 0;
  uint64_t bytes_written = 0, bytes_read = 0;
  uint64_t payload_bytes = 0;  // payload of the objects held (used_bytes less headers and padding)
  // The card's fill at its first eviction since it was opened (zero before
  // it): the payload of the objects held then plus that of the stores then
  // reserved and being written that were acknowledged afterwards (a key
  // counted once, at its newest copy); how many stores were in flight then,
  // and how many of those were acknowledged and how many failed so far.
  uint64_t first_eviction_held_bytes = 0, first_eviction_inflight_stores = 0;
  uint64_t first_eviction_inflight_acked = 0, first_eviction_inflight_failed = 0;
  uint64_t recovered_objects = 0;
  double recovery_seconds = 0;
  // Damage the open's recovery proved (docs/card_format.md, Recovery): the
  // regions, and the objects found behind it (their payload) that no newer
  // copy or delete supersedes: lost.
  uint64_t recovery_damaged_regions = 0, recovery_lost_objects = 0, recovery_lost_bytes = 0;
  // Store sequence numbers left before every store is refused (46 bits), and
  // those the open skipped for records it could neither hide nor read
  // (docs/card_format.md, Recovery, "A region header not walked").
  uint64_t store_seqs_left = 0, recovery_seq_margin = 0;
  // Through a gateway (r5): objects it wrote straight into this process's
  // memory (the connector), or into its clients' (the gateway); 0 on a card.
  uint64_t process_loads = 0;
  // Objects stored straight from this process's memory (the connector), or
  // from its clients' (the gateway); 0 on a card.
  uint64_t process_stores = 0;
  // The connector (r6): objects of stores sent through the ring though
  // process stores were granted, as one of their batch was larger than the
  // gateway's store buffer; 0 elsewhere.
  uint64_t process_stores_over_limit = 0;
  bool healthy = true;  // false from an I/O error until an I/O succeeds kFailingHold after the last
  // A connector on a gateway only (RemoteBackend); on_gateway is false
  // elsewhere, and then the ones after it are in no stats dict (not in
  // for_each_stat: the Python binding adds them). gateway_reachable: false
  // from a failed connect or a dropped connection until the next connect
  // succeeds (true before any attempt failed); gateway_reconnects:
  // connections its workers made again after losing theirs.
  // gateway_stalled: a request waited 5 s with nothing heard from the
  // gateway since it was sent, until it is heard from again
  // (RemoteBackend::stalled_locked); gateway_card_healthy: false from a load
  // or store the gateway answered with an I/O error of its card (message in
  // gateway_card_error) until a load hits or a store succeeds.
  // gateway_token_refused: the gateway's last answer to a connect refused the
  // token (TCP), until a connect succeeds. gateway_error: why the gateway is
  // not reached (audit 15 item 18): the last failure that took the link down
  // or kept it down (a connect or handshake, the gateway's refusal verbatim,
  // or a lost connection), with what fixes a refusal no retry heals
  // (RemoteBackend::note_down); empty from a successful connect.
  bool on_gateway = false;
  bool gateway_reachable = false;
  bool gateway_token_refused = false;
  uint64_t gateway_reconnects = 0;
  bool gateway_stalled = false;
  bool gateway_card_healthy = true;
  std::string gateway_card_error;
  std::string gateway_error;
};

// Calls f(name, value) for every field of st (uint64_t, double or bool): the
// one list the Python stats dict and the gateway's StatsReply are made from.
template <typename F>
void for_each_stat(const StoreStats& st, F&& f) {
  f("capacity_bytes", st.capacity_bytes);
  f("used_bytes", st.used_bytes);
  f("objects", st.objects);
  f("region_bytes", st.region_bytes);
  f("num_regions", st.num_regions);
  f("free_regions", st.free_regions);
  f("hits", st.hits);
  f("misses", st.misses);
  f("lookup_hits", st.lookup_hits);
  f("lookup_misses", st.lookup_misses);
  f("stores", st.stores);
  f("store_failures", st.store_failures);
  f("deletes", st.deletes);
  f("evicted_objects", st.evicted_objects);
  f("evicted_regions", st.evicted_regions);
  f("checksum_failures", st.checksum_failures);
  f("io_errors", st.io_errors);
  f("media_errors", st.media_errors);
  f("superblock_block_zero_bad", st.superblock_block_zero_bad);
  f("superblock_backup_bad", st.superblock_backup_bad);
  f("superblock_backup_blank", st.superblock_backup_blank);
  f("superblock_rewritten", st.superblock_rewritten);
  f("region_waits", st.region_waits);
  f("writes_overlapped", st.writes_overlapped);
  f("retired_regions", st.retired_regions);
  f("memory_failures", st.memory_failures);
  f("bytes_written", st.bytes_written);
  f("bytes_read", st.bytes_read);
  f("payload_bytes", st.payload_bytes);
  f("first_eviction_held_bytes", st.first_eviction_held_bytes);
  f("first_eviction_inflight_stores", st.first_eviction_inflight_stores);
  f("first_eviction_inflight_acked", st.first_eviction_inflight_acked);
  f("first_eviction_inflight_failed", st.first_eviction_inflight_failed);
  f("recovered_objects", st.recovered_objects);
  f("recovery_seconds", st.recovery_seconds);
  f("recovery_damaged_regions", st.recovery_damaged_regions);
  f("recovery_lost_objects", st.recovery_lost_objects);
  f("recovery_lost_bytes", st.recovery_lost_bytes);
  f("store_seqs_left", st.store_seqs_left);
  f("recovery_seq_margin", st.recovery_seq_margin);
  f("process_loads", st.process_loads);
  f("process_stores", st.process_stores);
  f("process_stores_over_limit", st.process_stores_over_limit);
  f("healthy", st.healthy);
}

// Counters of the operations a client of a card sees, kept by the card store
// and by the gateway client alike.
struct OpCounters {
  std::atomic<uint64_t> hits{0}, misses{0}, stores{0}, store_failures{0}, deletes{0};
  std::atomic<uint64_t> bytes_written{0}, bytes_read{0};
  void copy_to(StoreStats* st) const {
    st->hits = hits;
    st->misses = misses;
    st->stores = stores;
    st->store_failures = store_failures;
    st->deletes = deletes;
    st->bytes_written = bytes_written;
    st->bytes_read = bytes_read;
  }
};

}  // namespace adp
