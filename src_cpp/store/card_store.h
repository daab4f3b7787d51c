// SPDX-License-Identifier: Apache-2.0
// CardStore: the storage engine on the card (format: docs/card_format.md).
//
// The card is cut into equal regions. All writers share one write frontier:
// a bump allocator over the region open for appending. A store takes its
// byte range under a short lock and writes it in parallel with the others;
// a record that does not fit the frontier region's tail continues into the
// next region the frontier opens (that region's header says how many bytes
// at its start belong to it). So no region tail is lost to the object size
// and no writer holds back a region of its own. Recovery walks each region
// as a chain from its first record and stops at the first record that does
// not check out; a store is acknowledged only after every store reserved
// before it has been written or marked abandoned (a pad record), so every
// acknowledged store lies before that point. The in-memory index maps a
// 64-bit key hash to the object's place; the full key lives in the object's
// header block and is compared on every read, with both CRCs. The hash is
// index_hash (SipHash under a per-process secret, store/index_hash.h), so
// keys crafted to collide share nothing in the index. When no region
// is free, the least recently used sealed region is evicted as a whole (its
// objects, and any object with bytes in it, leave the index).
//
// Rooms (as CacheLib Navy divides its block cache): record encoding and
// decoding is in card_format, the regions (allocation, chain, pins, victim
// choice) in region_manager, the walk of the card at open in recovery,
// verify in verify.cc; this class holds the index and the put/get/commit path.
// Its definitions, by job: card_store.cc (open, format, lifecycle, stats),
// card_store_reserve.cc (the frontier, eviction, settling),
// card_store_put.cc (the put path, tombstones), card_store_get.cc (the read
// path), card_store_remove.cc; what they share: card_store_internal.h.
//
// Thread-safety: all public methods may be called from any thread; each
// thread brings its own IoContext (staging memory).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/store_types.h"
#include "store/card_device.h"
#include "store/card_format.h"
#include "store/key_index.h"
#include "store/region_manager.h"
#include "util/aligned_buffer.h"
#include "util/crc_worker.h"
#include "util/status.h"

namespace adp {

struct CardOptions {
  std::string path;
  uint64_t create_bytes = 0;         // size of a new image file; 0 = never create
  bool create_preallocated = false;  // a new image file's blocks allocated at creation (Creation::kAllocated)
  uint64_t region_bytes = 0;         // region size when formatting; 0 = chosen from the card size
  bool durable = true;               // fdatasync before a store is acknowledged
  int io_depth = 4;                  // card I/O in flight at once
  int recovery_threads = 4;
  // false: a blank card (block 0 all zeros) is NotFound, not formatted, so
  // that opening one (status, verify) never writes to it.
  bool format_blank = true;
  // The card opened O_RDONLY (CardDevice::Access::kReadOnly): nothing is
  // created, formatted or written, recovery included (older copies are left
  // for a read-write open to mark deleted); put, remove and a repairing
  // verify fail. Status and verify without --repair open a card so.
  bool read_only = false;
  // Block 0 holding readable bytes that are not a superblock of ours (not blank, not torn) while the backup
  // superblock is valid: false (every open but one), the open is refused, nothing written (damage, or another
  // program's data over the card: docs/card_format.md, "The backup superblock"); true (`verify --repair` only, the
  // operator's command; with read_only false), block 0 is taken for damage and rewritten from the backup.
  bool restore_block_zero = false;
  // A child fork() makes keeps nothing of the card (CardDevice::release_in_forked_child): set by an owner that
  // refuses its work in a forked child (the embedded connector, the binding's CardStore), so that the child does not
  // hold the card's flock while it lives. False (tools, tests using a CardStore directly): a child keeps the card's
  // descriptor and can store there (the AIO writer's fork mode), as before.
  bool release_in_forked_child = false;
};

class CardStore;

// Per-thread working state: staging memory.
class IoContext {
 public:
  IoContext() = default;
  IoContext(const IoContext&) = delete;
  IoContext& operator=(const IoContext&) = delete;
  ~IoContext();

 private:
  friend class CardStore;
  CardStore* store_ = nullptr;
  // In huge pages (aligned_buffer.h): a disk load of an object of one piece
  // or less is read into it in one request, then copied into the caller's
  // buffer, and a read into scattered 4 KiB pages (LMCache's L1) ran at
  // 0.5-0.85x of one into huge pages on this VM's disk.
  AlignedBuffer staging_{true};
  AlignedBuffer header_;  // header and tail blocks of a zero-copy write
  CrcWorker crc_;         // a disk store's body while it is written, a disk load's piece while the next is read
  // A disk store's write in flight while the next store is copied and checksummed (CardStore::put_each): that next
  // store's staging is the other one of staging_ and staging2_ (a staged object of up to 4 MiB), or the other two of
  // tails_'s four blocks (a zero-copy object's header and tail blocks). Made once, reused.
  AlignedBuffer staging2_{true};
  AlignedBuffer tails_;
  // The card's writer for this thread (Device::make_writer: a disk card's holds its AIO context), made at its first
  // store; writer_store_: the CardStore it is of (CardStore::serial_), another one's replaced.
  std::unique_ptr<DeviceWriter> writer_;
  uint64_t writer_store_ = 0;
};

struct VerifyReport {
  // checked: objects read and judged (good or bad), their payload bytes.
  uint64_t checked = 0, bad = 0, repaired = 0, bytes = 0;
  // Objects verify did not judge, neither checked nor bad: no_memory, those
  // it had no memory to read into (not the object's fault); gone, those the
  // read found deleted or replaced since the index was read (none while verify
  // holds the card alone), with their payload bytes.
  uint64_t no_memory = 0, no_memory_bytes = 0, gone = 0;
  std::vector<std::string> bad_objects;  // "region R offset O: reason"
  // Damage recovery proved when the card was opened (not read by verify):
  // "region R, offset A to E: what (what it cost)", one a damaged span.
  std::vector<std::string> damaged_spans;
};

// Whether an exception (std::bad_alloc, say) ever left one of a card store's operations (put, get, get_via_bounce,
// exists, remove), on any thread of this process: the store's shared state (a store's place on the frontier, its
// ticket that later stores wait behind, its pins) may be half made, so a caller that would go on past an exception
// (a gateway's connection) must not (session 25; CardStore is not exception-safe: see README, thread failures).
bool card_store_unwound();
// Those operations this thread is inside now (tests/cpp/thread_alloc_test.cc: its injection leaves them alone).
int card_store_calls_on_this_thread();

class CardStore {
 public:
  // Opens the card at opts.path: formats it when blank or newly created,
  // otherwise recovers the index from it (logged with count and duration).
  static Status Open(const CardOptions& opts, std::unique_ptr<CardStore>* out);
  // Writes a fresh superblock (new card id): every object on the card is gone.
  static Status Format(const std::string& path, uint64_t create_bytes, uint64_t region_bytes,
                       bool create_preallocated = false);
  // The same on a device of the caller's (tests: testing/fault_device.h).
  // opts.path, create_bytes and io_depth are not used.
  static Status OpenDevice(std::unique_ptr<Device> dev, const CardOptions& opts, std::unique_ptr<CardStore>* out);
  static Status FormatDevice(Device& dev, uint64_t region_bytes);
  ~CardStore();

  // Stores items[0..n). results[i] says how item i went. Objects become
  // visible only after all their bytes are written (and synced if durable)
  // and only if still_wanted() is true at that moment; a caller that gave up
  // (deadline) gets nothing indexed.
  void put(IoContext& ctx, const PutItem* items, size_t n, Status* results, const std::function<bool()>& still_wanted);
  // The same for items of several callers (a connector worker's slices of
  // several batches): all written, then one sync, then item i is indexed only
  // if wanted(i) is true at that moment (asked once the sync is done, for each
  // written item, in order, before any is indexed).
  // With `share`, its sync may be shared with a later put (a connector worker's store slices queued while it wrote
  // these: EmbeddedSession::put_slices, session 35): see SyncShare.
  struct SyncShare;
  void put_each(IoContext& ctx, const PutItem* items, size_t n, Status* results,
                const std::function<bool(size_t item)>& wanted, SyncShare* share = nullptr);
  // One sync for two puts of one thread: the first's items written (and every store reserved before them on the
  // card), its `before_sync` runs the second put with `since` set to the first's mark; that put's sync covers the
  // first's writes too (they completed before it began; a failed flush since the first's first write was issued
  // fails it: util/group_sync.h), and its result, `result`, is used as the first's own sync: nothing of the first is
  // indexed or acknowledged before it. A put that makes no sync of that kind (it failed before writing: staging
  // memory, read-only) leaves `result` empty, and the first syncs itself.
  struct SyncShare {
    // In (the second put): the mark of the first put's first write; its sync covers from there.
    uint64_t since = UINT64_MAX;
    // In (the second put): the regions the first put holds pinned (its objects', until its commit, which comes after
    // the second returns): the second's own pins too, never waited for (advance_frontier). Until session 36 the
    // second put, full with every region held by the first's objects, waited 5 s for them before NoSpace.
    std::span<const uint32_t> pins;
    // In (the first put): runs the second with the first's mark and pins; returns its sync's result (nullopt: none
    // made).
    std::function<std::optional<Status>(uint64_t since, std::span<const uint32_t> pins)> before_sync;
    // Out: this put's sync result, where it made one (any item written, or `since` given).
    std::optional<Status> result;
    // In (either put): called once the put's writes are done and every store reserved before them resolved, just
    // before its sync (or before_sync) begins, on a durable card; not called where nothing was written. The
    // connector lets the worker's other thread write meanwhile (session 36: the sync off the writer's path).
    const std::function<void()>* written = nullptr;
  };
  bool durable() const { return durable_; }

  // Reads key and checks its header and key, then lets deliver() place the
  // payload, checking the payload CRC on the way; `into` says whether the
  // card is read before deliver() or by its copy() (see ReadInto). Ok:
  // delivered and intact. NotFound: a miss, a declined delivery, or a failed
  // checksum (counted, and the object is dropped). Otherwise an I/O error.
  // `pieces` (kPieces only) runs each piece written into the destination;
  // once it declines part way, the load stops and fails as TimedOut (the
  // buffer may hold the pieces read before; a miss would promise it
  // untouched), which fails the caller's future. `piece_bytes` (kPieces, a
  // 4 KiB multiple; 0: kGuardedPieceBytes, 4 MiB) is the size of the pieces
  // an object larger than 4 MiB is read in straight into an aligned
  // destination: the most a load can write after `pieces` last agreed, and
  // the bytes one load keeps in the card's queue.
  Status get(IoContext& ctx, std::string_view key, const DeliverPayloadFn& deliver, ReadInto into = ReadInto::kStaging,
             const PieceGuardFn& pieces = {}, size_t piece_bytes = 0);
  // Loads keys[0, n) one after another, each as get(ctx, keys[i], deliver(i, ...), kPieces, pieces, piece_bytes)
  // would (results[i] its Status), on two contexts taken in turn: while a disk card's staged object (one piece or
  // less) is copied into its buffer, its CRC computed on the way (on its context's CrcWorker, inside its `pieces`,
  // so nothing is written after `pieces` returned), the next key's object is read into the other context's staging
  // (not where the next key is this one again: read after this one's load, as get() would).
  // A load of 256 KiB objects left the disk idle between two reads of a worker for the copy (session 35, issue 10);
  // the next read then starts inside this one's `pieces`, which waits for both (a deadline held up by one read of
  // up to a piece, as a direct load's piece holds it). The next key is looked up and read before deliver() sees it.
  // A next key of more than a piece is only looked up there, and loaded after (its deliver() and pieces would take
  // the caller's guard again on this thread, inside the copy's `pieces`).
  // An object of more than a piece (read straight into an aligned buffer): its CRC runs on its context's CrcWorker
  // while the next key's object is read (deliver() asked for the next key's buffer then, its pieces each under
  // `pieces`), then its header and tail are checked: a worker's disk request no longer waits for the CRC of the
  // object before it (32 MiB: 3-4 ms of this VM's CPU, more on a loaded one; session 37's strace, a worker's reads
  // 4-9 ms apart against fs_native's 0.2). A damaged object is then judged (dropped) after the next one was read.
  using DeliverEachFn = std::function<bool(size_t i, size_t size, const CopyFn& copy)>;
  void get_each(IoContext& ctx, IoContext& other, const std::string_view* keys, size_t n, Status* results,
                const DeliverEachFn& deliver, const PieceGuardFn& pieces, size_t piece_bytes = 0);
  // Protocol r5 loads: hands key's payload to sink in pieces of
  // piece_bytes (0: kBouncePieceBytes), the last one shorter, each first copied into a bounce buffer
  // (the caller's, reused) and handed out from there, so that while sink
  // runs (a process_vm_writev that a hostile client can stall) this load
  // holds nothing of the store: no region pinned, no IoContext. with_ctx(fn)
  // runs fn with a leased IoContext (false: none came free). run_pieces(n,
  // piece) runs piece(i, slot) for the n pieces, in order on this thread
  // when empty, else as PiecePool::run does (any order, several threads at
  // once, slot < bounces.size() the buffer that thread uses; sink must then
  // be thread-safe); it returns once every piece started has returned. A
  // memory-speed card: header and whole key checked first (on this thread);
  // then for each piece the entry is checked (same seq, its regions of the
  // epochs first seen) and its regions pinned only for the copy, its CRC
  // fused, the pieces' CRCs joined in order after the last; an entry found
  // changed before a piece ends the load NotFound (the pieces sent were
  // that object's); the CRC's verdict comes after every piece returned
  // (damaged: dropped, NotFound). Other cards: under with_ctx the object is
  // read and checked whole in the context's staging, which then trades
  // places with `hold` (the caller's), so the context goes back before the
  // first piece goes out. run_pieces may return false with no piece having
  // failed (it ran none, or its caller may not go on): the load then ends
  // TimedOut, and nothing after the pieces touches the store or its device
  // (a gateway may have closed its card meanwhile, review r7 B1): a piece
  // counts its own failure, and the load's in-flight count (Foreground,
  // device.h) ends in a count that outlives the device.
  using WithContextFn = std::function<bool(const std::function<void(IoContext&)>&)>;
  using RunPiecesFn = std::function<bool(size_t n, const std::function<bool(size_t piece, int slot)>& piece)>;
  Status get_via_bounce(std::string_view key, const std::function<bool(size_t size)>& accept,
                        const WithContextFn& with_ctx, std::span<AlignedBuffer> bounces, AlignedBuffer* hold,
                        const SinkFn& sink, const RunPiecesFn& run_pieces = {}, size_t piece_bytes = 0);
  // get_via_bounce's pieces. kBouncePieceBytes: an object that helpers may
  // split (PiecePool); each piece is copied into a bounce buffer with its
  // CRC and written into the client with process_vm_writev, which then reads
  // a piece still in the copying core's L2 (2 MiB a core on both machines).
  // 16-core probe (benchmarks/probes/process_bounce_split.cc,
  // results/raw/2026-12-01-1615-bounce-split-16core.txt): 16 connections, one
  // thread each, 29-31 GB/s with 256 KiB pieces against 24-33 with 1 MiB; 4
  // connections of two threads, 19-22 against 14-20. kLargeBouncePieceBytes
  // (the bounce slot's size, AlignedBuffer's least): the largest piece of an
  // object its own thread writes alone (the gateway's ADP_BOUNCE_PIECE_KB);
  // the session-eight probe's 1 MiB bounce ran at 27.6-27.8 GB/s against
  // 28.0-33.5 with 256 KiB (results/raw/2026-12-01-1948-16core-load-profile/
  // probe.txt), and the gateway's A/B (benchmarks/README.md, "Session eight:
  // loads, larger pieces") showed no gain, so it is not the default.
  static constexpr size_t kBouncePieceBytes = 256u << 10;
  static constexpr size_t kLargeBouncePieceBytes = 1u << 20;
  // True if the card is memory (an image file on tmpfs or ramfs): a read
  // takes a memcpy's time, bounded by the object size.
  bool memory_speed() const { return device_->memory_backed(); }

  bool exists(std::string_view key);
  // Ok: the key was present and its delete is on the card. NotFound: it was
  // not there (its whole key in the object's header is compared first, so
  // another key is never deleted; an object whose header is found damaged
  // is dropped, as a load drops it). Busy: a newer copy was stored meanwhile (and
  // stays), or a store of the key is in flight or being voided (see unsettled_locked). Otherwise the error that kept
  // the delete off the card (the key stays readable).
  Status remove(IoContext& ctx, std::string_view key);

  // Reads every indexed object and checks it as a load would. Bad objects
  // are reported, and dropped (as a failed load drops them) when `repair`.
  // progress(done, total) is called after each object. A repair on a
  // read-only card is refused (InvalidArgument) before anything is read.
  Status verify(IoContext& ctx, bool repair, const std::function<void(uint64_t, uint64_t)>& progress,
                VerifyReport* report);

  StoreStats stats() const;
  // Where this open's rewrite of a bad superblock copy failed ("" where none failed): "writing its backup
  // superblock (4096 bytes at offset 1044480) failed: <the device's error>" (or syncing; or block 0, offset 0).
  // Set at open, never changed after: `verify --repair` says it (the stats say only superblock_rewritten 0).
  const std::string& superblock_rewrite_error() const { return superblock_rewrite_error_; }
  // The stores' and deletes' looks at the pending tombstones (retry_pending), lock taken, since the open: none while
  // none is due but a delete's (tests/cpp/evict_header_test.cc).
  uint64_t pending_scans() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_scans_;
  }
  const std::string& path() const { return device_->path(); }
  // Largest payload one object can hold: objects span regions, up to half
  // of the card's regions (kMaxObjectBytes at most).
  uint64_t max_object_bytes() const {
    return std::min<uint64_t>(
        uint64_t(std::max<uint32_t>(num_regions_ / 2, 1)) * (region_bytes_ - kBlockSize) - kBlockSize, kMaxObjectBytes);
  }

  // Which bound max_object_bytes() is, in words (logs and errors).
  std::string max_object_bound() const {
    if (max_object_bytes() == kMaxObjectBytes) return "the format's largest object, 256 MiB";
    return "half its " + std::to_string(num_regions_) + " regions of " + std::to_string(region_bytes_) +
           " bytes, less their headers";
  }

  // Validates a key against the format's bounds (common/store_types.h).
  static Status check_key(std::string_view key) { return adp::check_key(key); }

 private:
  friend class IoContext;
  struct Location {
    uint32_t region;
    uint64_t offset;
    uint64_t epoch;
    uint64_t seq;
    uint64_t payload_bytes;
    uint64_t hash = 0;  // index_hash of the key
    // The object's key, for its tombstone (empty: write_tombstone reads it
    // from the object's header).
    std::string key;
  };
  // An older copy to be marked deleted on the card. Its region is pinned
  // while the tombstone is written; `guards` (or none) are the regions the
  // newer copy or delete has bytes in (its first region and every region it
  // continues into), pinned until the tombstone is durable, so the older
  // copy cannot outlive what supersedes it: the eviction of any of them
  // drops the newer copy (before session 24 only the first was pinned: a
  // region a newer copy continued into could be evicted while the older
  // copy's tombstone was pending, and the older copy came back at the next
  // open; tests/cpp/continuation_guard_test.cc).
  struct Stale {
    Location loc;
    std::vector<uint32_t> guards;
    Status result;  // write_tombstones: how its tombstone went (set there)
    // Pending: its tombstone's writes that failed so far, and the retry_pending call (pending_calls_) from which
    // it is tried again (its back-off: write_tombstones).
    uint32_t failures = 0;
    uint64_t due = 0;
  };
  // The regions the object at `offset` of `region` with `payload_bytes` has bytes in (at least `region`).
  std::vector<uint32_t> parts_of_locked(uint32_t region, uint64_t offset, uint64_t payload_bytes) const;
  // Pins `guards`, the guards of a tombstone over the older copy whose header is in region `older`, less `older`
  // itself (erased from guards: allocates nothing). A newer copy with bytes in the older copy's own region needs no
  // guard there: evicting that region drops the older copy with it (its header under a new epoch no longer walks).
  // Until session 35 it was pinned too (review34b): a region no eviction could take while the tombstone was
  // pending (a block that refuses writes: until the reopen). Under mu_.
  void pin_guards_locked(uint32_t older, std::vector<uint32_t>& guards);

  CardStore(std::unique_ptr<Device> dev, const Superblock& sb, bool durable, bool read_only);
  Status recover(int threads);
  // What put, remove and a repairing verify answer on a read-only card.
  Status read_only_refusal(const char* what) const;
  uint64_t region_offset(uint32_t r) const { return data_offset_ + uint64_t(r) * region_bytes_; }

  // A device extent of a record: `len` bytes at card offset `at`.
  struct Extent {
    uint64_t at, len;
  };
  // Where a store goes: its first region and offset, every region it has
  // bytes in (pinned until the commit), its extents, and its ticket (see
  // unresolved_).
  struct Placement {
    uint32_t region = 0;
    uint64_t offset = 0, epoch = 0, seq = 0, ticket = 0;
    uint64_t since = 0;  // its first region's open_mark: what its sync is given (Device::sync)
    std::vector<uint32_t> regions;
    std::vector<Extent> ext;
  };
  // Takes the footprint of a store of `payload_bytes` (key hash `hash`) at
  // the write frontier (opening, and evicting for, the regions it continues
  // into), pins them and registers the ticket, and the store as in flight. With no region free or evictable it
  // waits for one up to 5 s from its start (advance_frontier), none with `may_wait` false (put_each: a later item
  // of a put whose earlier item's wait ran out). `own`: the regions the caller's put holds pinned (its earlier
  // items', one entry a pin), which it lets go of only at its commit: no wait is made for them. `shared`: the
  // caller is the second put of a shared sync (SyncShare), which never queues for frontier_mu_ behind a store that
  // waits for a region (NoSpace at once): see region_waiters_.
  Status reserve(IoContext& ctx, uint64_t hash, uint64_t payload_bytes, Placement* pl, bool may_wait = true,
                 std::span<const uint32_t> own = {}, bool shared = false);
  // The regions a reservation's put holds pinned itself: its earlier items' (`earlier`) and those of the item being
  // reserved, taken so far (`current`, the regions it continues from). None goes before the put's commit.
  struct OwnPins {
    std::span<const uint32_t> earlier, current;
  };
  // Opens the next frontier region (a free one, or one evicted for it) whose
  // first `cont_bytes` continue the current frontier's last record; writes
  // and syncs its header. Called with frontier_mu_ and `lock` (mu_) held;
  // unlocks mu_ around the I/O. A region whose header write fails is put back
  // as it was (an evicted one's objects marked deleted: fail_eviction_locked)
  // and another is tried, up to kOpenTries in all; those whose header write
  // the device refused are retired when another one opened (a bad block);
  // the others (a failed sync, no memory) go to the free list, as when none
  // opens. With no region free or evictable
  // (every sealed one pinned by a load or store in flight) it waits for one until `deadline` (the reservation's:
  // reserve), then refuses (NoSpace); at once where every such region is one `own` holds (the reservation's own
  // put: no one else's unpin would free it).
  Status advance_frontier(IoContext& ctx, std::unique_lock<std::mutex>& lock, uint64_t cont_bytes,
                          std::chrono::steady_clock::time_point deadline, const OwnPins& own, uint32_t* region);
  static constexpr int kOpenTries = 3;
  // Drops from the index every object with bytes in region r (sealed, unpinned), keeping each dropped entry in
  // evicting_ until r's new header is durable. The caller has made room in evicting_ for r's key list.
  void evict_locked(uint32_t r);
  // r's new header could not be written (or synced): r is made again the sealed region `saved` (its state before
  // the eviction: epoch, chain), with no object indexed, and each entry evict_locked dropped goes to pending_ as a
  // copy to mark deleted (its old record may walk again at the next open); one whose key was stored anew meanwhile
  // (committed while r's header was written, with no older copy in the index to mark) guarded by the newer copy's
  // regions. `held` slots of pending_room_ are the caller's. Empties evicting_.
  void fail_eviction_locked(uint32_t r, RegionManager::Region&& saved, size_t held);
  // Calls f(region, bytes, card offset) for each piece of the record of
  // `footprint` bytes at (region, offset), following the frontier's chain.
  // False if the chain is broken (a region it continues into was reused).
  template <typename F>
  bool for_each_part_locked(uint32_t region, uint64_t offset, uint64_t footprint, F f) const;
  bool extents_locked(uint32_t region, uint64_t offset, uint64_t footprint, std::vector<Extent>* ext,
                      std::vector<uint32_t>* regions) const;
  // Reads or writes the bytes [logical, logical + sum of iov) of a record
  // laid over `ext` (one I/O per extent touched).
  Status io_mapped(bool write, const std::vector<Extent>& ext, uint64_t logical, const iovec* iov, int n);
  // The store of `pl` failed: marks its place as a pad record, or, if that
  // cannot be written, the region as broken there (and moves the frontier).
  void abandon(IoContext& ctx, const Placement& pl, uint64_t payload_bytes);
  // The store of `ticket` is written, or (failed) marked abandoned.
  void resolve(uint64_t ticket, bool failed);
  // The store of `ticket` is acknowledged (indexed, or superseded by a newer
  // copy at its commit) or failed: it is no longer in flight.
  void settle_locked(uint64_t ticket, bool acked);
  // The first eviction since open: records what the card holds (first_eviction_).
  void note_first_eviction_locked();
  void unpin(uint32_t r);
  // ctx's writer of this card (made at its first store, then reused); nullptr for want of memory.
  DeviceWriter* writer_of(IoContext& ctx);
  // Writes object `it` over `ext`, the header (with `flags`) and its CRC
  // last. For memory-speed cards. `mapped` (the extents prepared for a mapped write;
  // any memory): the payload is copied into the mapping and checksummed in
  // the same pass. Otherwise (memory 4 KiB aligned, at least one block):
  // payload pieces, each checksummed just before it is written.
  Status write_in_pieces(IoContext& ctx, const std::vector<Extent>& ext, const PutItem& it, uint64_t epoch,
                         uint64_t seq, uint32_t flags, bool mapped);
  // Writes object `it` from its fill (PutItem::fill) over `ext`: into the
  // mapping when `mapped`, else through staging; the CRC over the bytes as
  // they landed. *card_error: whether a failure was the card's (an I/O
  // error) rather than the fill's or staging memory's; *source_failed:
  // whether it was the fill's (the caller's source, not this store's).
  Status write_filled(IoContext& ctx, const std::vector<Extent>& ext, const PutItem& it, uint64_t epoch, uint64_t seq,
                      uint32_t flags, bool mapped, bool* card_error, bool* source_failed);
  // Writes object `it` from 4 KiB-aligned memory to a disk card: the body
  // while ctx's CrcWorker checksums it, then the header.
  Status write_body_then_header(IoContext& ctx, const Placement& pl, const PutItem& it, uint64_t epoch, uint64_t seq,
                                uint32_t flags);
  bool continues(uint64_t offset, uint64_t payload_bytes) const {
    return record_continues(offset, payload_bytes, region_bytes_);
  }
  // Why a delete of `hash` cannot be done now (a store of it in flight, or
  // its void not yet on the card); Ok if it can. Caller holds mu_.
  Status remove_refusal_locked(uint64_t hash) const;
  // A delete's check of the object of (hash, e) (its region pinned, of
  // epoch `epoch`): reads its header block into ctx.header_ and compares
  // the whole key. Ok: key's object. NotFound: another key's, deleted or
  // replaced meanwhile (*changed set: its tombstone, or one half written,
  // is there), or damaged (then dropped, as a load drops it). Otherwise the
  // read's error (counted).
  Status check_remove_header(IoContext& ctx, std::string_view key, uint64_t hash, const IndexEntry& e, uint64_t epoch,
                             bool* changed);
  // Marks the object at loc deleted on the card (region must be pinned):
  // a tombstone naming loc.key, or (empty) the key its header holds if it is
  // still loc's object, else no key (a damaged header).
  Status write_tombstone(IoContext& ctx, const Location& loc);
  // Writes the tombstones of `stale` (synced when durable), then unpins
  // their regions and guards. Those that fail go to pending_ (their guards
  // stay pinned) and are retried by retry_pending(). False if any failed.
  // The caller holds `held` >= stale.size() slots of pending_room_ (given
  // back here): a failed one is never dropped for want of memory (session 27).
  bool write_tombstones(IoContext& ctx, std::vector<Stale>& stale, size_t held);
  // Holds k more slots of pending_'s capacity (pending_room_), growing it if
  // needed: std::bad_alloc leaves nothing held. Under mu_.
  void hold_pending_room_locked(size_t k);
  // Where recovery's walk of a region (its header's epoch) ended before its end (end: the region's), or a span of
  // blocks it could not read and stepped over (end: where it resumed).
  struct Cut {
    uint32_t region;
    uint64_t epoch, at, end;
  };
  // At a read-write open: a pad over each crash's cut recovery's walk ended
  // at, to the region's end, and over each span of unreadable blocks it
  // stepped over, to where it resumed, and zeros over each
  // region header in `unseen` (one it could not walk: the region is free),
  // synced when durable, so that no later walk finds the records behind
  // them (their seqs unseen by this open: recovery.cc). False if any failed;
  // then *left (if given) holds where the records may stay: {region, epoch,
  // from, to} for each pad or zeroing not written (from: the cut, or
  // kBlockSize behind a header), or every one of them if the sync failed.
  bool pad_cuts(const std::vector<Cut>& cuts, const std::vector<uint32_t>& unseen, std::vector<Cut>* left = nullptr);
  // What hide_behind found behind the pads and zeroings pad_cuts could not
  // write (docs/card_format.md, Recovery, "A region header not walked").
  enum class Behind {
    kHidden,   // every header of this card there zeroed (synced): no later walk finds a record there
    kBounded,  // every block read; some header not zeroed, its seq at most *highest
    kUnknown,  // a block could not be read (or a header of this card that does not check out not zeroed)
  };
  // Reads each span of `left` ({region, -, from, to}),
  // 256 KiB at a time, zeroes each block there that holds an object header
  // of this card (any epoch: nothing there is indexed), and sets *highest to
  // the highest seq of those that check out (zeroed or not, whatever the
  // sync). At most the regions' blocks are read, only where a write failed.
  Behind hide_behind(const std::vector<Cut>& left, uint64_t* highest);
  // How far past the highest seq recovery saw the next one is set when
  // records it could not see may stay on the card (docs/card_format.md,
  // Recovery, "A region header not walked"): kUnseenSeqMargin, or the card's
  // blocks if more.
  uint64_t unseen_seq_margin() const;
  // Store seqs left before a store is refused (kMaxIndexSeq): stat
  // store_seqs_left. Under mu_ (or recovery's).
  uint64_t seqs_left() const { return next_seq_ > kMaxIndexSeq ? 0 : kMaxIndexSeq + 1 - next_seq_; }
  // An open that leaves fewer logs a WARNING (1/16 of the 46 bits: 2^10
  // opens that add unseen_seq_margin, or 4e12 stores).
  static constexpr uint64_t kSeqsLeftWarned = uint64_t(1) << 42;
  // Queues into *stale the void (a tombstone of seq 0) of a copy written but
  // never indexed, its region pinned; a delete of its key is refused until
  // the void is on the card (voiding_). Under mu_.
  void void_copy_locked(Location loc, std::vector<Stale>* stale);
  // Moves the tombstones of `stale` unwritten to pending_ (an exception out of a put): their regions unpinned, their
  // guards kept pinned, the voids' voiding_ entries erased; retried as any failed one. Until session 27 they were
  // dropped, and an older copy or a never-indexed one stayed unmarked on the card (a delete undone at the next
  // open). Into pending_room_ the caller holds (stale.size() slots at least): allocates nothing. Under mu_.
  void pend_stale_locked(std::vector<Stale>& stale);
  // Appends st to pending_ (into room the caller held: no allocation) and lowers pending_due_ to its `due` (0 for
  // one never tried): every tombstone made pending comes through here, so none is held back by a stale bound. Under
  // mu_.
  void push_pending_locked(Stale&& st) {
    if (st.due < pending_due_.load()) pending_due_ = st.due;
    pending_.push_back(std::move(st));
  }
  // Writes again the pending tombstones that are due (pending_calls_ has reached their `due`), and, with `hash`,
  // every one of that key (a delete: refused while one is pending, so never held back). The rest stay pending.
  void retry_pending(IoContext& ctx, const uint64_t* hash = nullptr);
  // A pending tombstone whose write failed `failures` times is skipped by the next 2^(failures-1) - 1 calls of
  // retry_pending, at most kPendingBackoffCalls - 1: the first retry is the next store's or delete's, as before
  // session 34, and a block that keeps refusing writes costs each store a write no more (stall34 L4).
  static constexpr uint64_t kPendingBackoffCalls = 1024;
  // A failed operation's count: memory_failures when it failed for want of
  // this process's memory (Status::IoClass::kGatewayMemory: staging, a
  // bounce buffer, recovery's block), else io_errors (the card's; the device
  // logs failing/working transitions).
  void count_failure(const Status& s) {
    (s.io_class() == Status::IoClass::kGatewayMemory ? counters_.memory_failures : counters_.io_errors)++;
  }
  // Erases the entry (accounted as below) and marks the stores of its key in flight with a lower seq outranked.
  void erase_entry_locked(uint64_t hash, const IndexEntry& e);
  // erase_entry_locked's accounting (live, used and payload bytes) without the index erase.
  void unaccount_locked(const IndexEntry& e);
  // Reads the object of (hash, e) into ctx's staging and checks header, key
  // hash and payload CRC. Empty string if good, else the reason. *io is
  // NotFound (and the reason empty) when the object is no longer current:
  // evicted, replaced or deleted since e was looked up. That is no damage.
  // check_payload=false leaves the payload CRC to the caller (get fuses it
  // with the delivery copy). A 4 KiB aligned `payload_dst` receives the
  // payload (same I/O, checked there); otherwise it lands in staging. With
  // `guard` (a kPieces load), every write into payload_dst runs under it, in
  // pieces of guard_piece_bytes (0: kGuardedPieceBytes); once it declines,
  // *io is TimedOut.
  // With `key`, the whole key is compared with the header's where the header
  // is checked (before any payload byte on a mapped card and with a guard):
  // another key is NotFound in *io, no damage.
  // With `deferred_epoch` (get_each's loads of more than a piece), a direct load with check_payload stops after its
  // I/O: read without an error, it returns empty with the region's epoch there, header, tail and CRC left to
  // finish_direct.
  std::string read_and_check(IoContext& ctx, uint64_t hash, const IndexEntry& e, Status* io, bool check_payload,
                             uint8_t* payload_dst = nullptr, const PieceGuardFn* guard = nullptr,
                             std::string_view key = {}, size_t guard_piece_bytes = 0,
                             uint64_t* deferred_epoch = nullptr);
  // How read_and_check read the payload: copied from the card's mapping (its CRC fused), straight into the
  // caller's 4 KiB aligned buffer (the header and a partial last block into staging), or into staging whole.
  enum class ReadKind { kMapped, kDirect, kStaged };
  // read_and_check's verdict once its I/O is done (its *io as the I/O left it): an I/O failure counted; header and
  // key checked (header_why: the answer of a check made already, mapped); a direct load's tail copied under
  // `guard`; the payload's CRC (body_crc: of what a mapped or direct read covered) compared.
  std::string judge_read(IoContext& ctx, uint64_t hash, const IndexEntry& e, uint64_t epoch, std::string_view key,
                         Status* io, bool check_payload, uint8_t* payload_dst, const PieceGuardFn* guard, ReadKind kind,
                         uint32_t body_crc, const std::string* header_why);
  // get_each's read of the next key, run beside a CRC; its argument: whether it runs inside a `pieces` call.
  using AheadFn = std::function<void(bool inside_pieces)>;
  // A direct load deferred by read_and_check (region epoch `epoch`, payload in payload_dst): its CRC, on ctx's
  // CrcWorker while ahead() runs on this thread when given (the next key's read), then judge_read.
  std::string finish_direct(IoContext& ctx, uint64_t hash, const IndexEntry& e, uint64_t epoch, Status* io,
                            uint8_t* payload_dst, const PieceGuardFn* guard, std::string_view key,
                            const AheadFn* ahead);
  // Checks an object's header block against e (region epoch `epoch`): empty
  // if it is e's object (or, with *io set to NotFound, if it was deleted
  // meanwhile, or it is another key than a non-empty `key` with the same
  // hash), else the reason it is damaged. (Recovery's check of a header
  // its walk meets, no entry yet: check_walked_header, recovery_damage.h.)
  std::string check_entry_header(const uint8_t* block, uint64_t hash, const IndexEntry& e, uint64_t epoch,
                                 std::string_view key, Status* io) const;
  // key's index entry and hash (a miss counted), for get and get_via_bounce.
  Status lookup(std::string_view key, uint64_t* hash, IndexEntry* e);
  // A key's object read ahead into a context's staging by get_each (stage_ahead), for get_one: its lookup's
  // answer, and read_and_check's (io, bad) with whether the header holds another key.
  // `direct`: an object of more than a piece read straight into `dst` (deliver() answered `delivered`), its checks
  // deferred (read_and_check's `epoch`), header in ctx's staging.
  // `asked`: deliver() was asked for an object of more than a piece and gave an unaligned buffer (`dst`): nothing
  // read, get_one stages it without asking deliver() again.
  struct StagedRead {
    Status lookup;
    uint64_t hash = 0;
    IndexEntry e{};
    Status io;
    std::string bad;
    bool other = false;
    bool direct = false;
    bool delivered = false;
    uint8_t* dst = nullptr;
    uint64_t epoch = 0;
    bool asked = false;
  };
  // Looks key up and, as get()'s kPieces load reads a disk card's object, reads it: one of a piece or less into
  // ctx's staging, header checked (the payload's CRC at the copy); a larger one, once deliver() gave a 4 KiB
  // aligned buffer, straight into it in pieces under `pieces` (of piece_bytes), header, tail and CRC left to
  // get_one (finish_direct); with an unaligned one, deliver()'s answer kept (`asked`), nothing read. False if it
  // kept nothing (a memory-speed card; a larger object `inside_pieces`: ahead() runs inside a `pieces` call, whose
  // guard deliver() and `pieces` would take again on this thread: get_one loads it after).
  bool stage_ahead(IoContext& ctx, std::string_view key, StagedRead* out, const DeliverPayloadFn& deliver,
                   const PieceGuardFn& pieces, size_t piece_bytes, bool inside_pieces);
  // Whether the object header in ctx's staging holds a key other than `key` (one with the same index hash).
  static bool staged_other_key(const IoContext& ctx, std::string_view key);
  // get(), kPieces when `staged` or `ahead` is given: `staged`, the object read ahead into ctx (stage_ahead);
  // `ahead`, run on this thread while a staged object's copy runs on ctx's CrcWorker (inside `pieces`: ahead(true)),
  // or a direct load's CRC (after its pieces: finish_direct, ahead(false)).
  Status get_one(IoContext& ctx, std::string_view key, const DeliverPayloadFn& deliver, ReadInto into,
                 const PieceGuardFn& pieces, size_t piece_bytes, StagedRead* staged, const AheadFn* ahead);
  // Removes a damaged object from the index and marks it deleted on the card
  // (its tombstone naming `key`, the caller's whose index hash found it, or,
  // empty, as write_tombstone finds it).
  void drop_damaged(IoContext& ctx, uint64_t hash, const IndexEntry& e, std::string_view key = {});
  // Whether the header of e (the entry of hash when a load found it) may
  // have been overwritten while the load read it: e is no longer the entry
  // of hash (deleted, replaced, evicted, or dropped), or a delete of it is
  // writing its tombstone. A bad header read then is that write, half done
  // (a miss), not damage (docs/card_format.md, Writing).
  bool overwritten_meanwhile(uint64_t hash, const IndexEntry& e);

  // At a read-write open whose superblock copies disagree: writes `good` (the copy the card opened with) over
  // the bad one (block 0 where superblock_block_zero_bad_, else the backup, bad as `backup_why` says, or blank)
  // and syncs it; superblock_rewritten_ says whether it landed (a failure: a WARNING, the card served as opened,
  // superblock_rewrite_error_ set).
  void rewrite_superblock_copy(const uint8_t* good, const std::string& backup_why);

  std::unique_ptr<Device> device_;
  const uint64_t card_id_;
  const uint64_t data_offset_;
  const uint64_t region_bytes_;
  const uint32_t num_regions_;
  const bool durable_;
  const bool read_only_;  // CardOptions::read_only

  // Serializes reservations at the frontier (held across opening a region);
  // taken before mu_.
  std::mutex frontier_mu_;
  mutable std::mutex mu_;
  std::condition_variable unpinned_;
  // Stores waiting for a region (advance_frontier's wait on unpinned_, frontier_mu_ held: 0 or 1). Guarded by mu_.
  // The second put of a shared sync (SyncShare) runs before the first put's commit, which lets go of the first's
  // pins: queued for frontier_mu_ behind a store that waits for a region the first put holds, neither went on
  // until that store's 5 s ran out, and it failed NoSpace where the first's commit would have freed a region
  // (review36, region_wait_test store_waiting_beside_a_shared_sync). Such a second put is refused NoSpace instead.
  int region_waiters_ = 0;
  std::condition_variable resolved_;
  int64_t frontier_ = -1;  // the region open for appending; guarded by both
  // Tickets of reservations not yet written (or marked abandoned): a store
  // is acknowledged only when every ticket before its own is gone, so that a
  // hole in front of it cannot hide it from recovery. Guarded by mu_.
  std::set<uint64_t> unresolved_;
  uint64_t next_ticket_ = 1;
  RegionManager regions_;  // guarded by mu_
  KeyIndex index_;         // guarded by mu_
  uint64_t used_bytes_ = 0;
  uint64_t payload_bytes_ = 0;  // payload of the indexed objects
  // Stores reserved and not yet acknowledged or failed, by ticket. Guarded by mu_.
  struct InFlight {
    uint64_t hash, payload_bytes, seq;
    bool at_first_eviction = false;  // in flight when the first eviction happened
    // A copy of its key with a higher seq was indexed and has left the index since (evicted, or dropped as
    // damaged): the tombstones that copy wrote over older copies outrank this one at recovery, so it commits as
    // superseded, never indexed (erase_entry_locked; session 30).
    bool outranked = false;
  };
  // Ordered (node-based): reserve() makes its node before it changes anything and inserts it without allocating.
  std::map<uint64_t, InFlight> inflight_;
  // Keys of copies never indexed (their sync failed, or their caller gave
  // up) whose voiding tombstone is being written (one entry per copy); a
  // failed one goes to pending_. Guarded by mu_.
  std::unordered_multiset<uint64_t> voiding_;
  // True while a copy of `hash` that may be on the card is neither indexed
  // nor durably voided: a store of it in flight, or its void being written
  // (pending_ holds those whose void failed). A delete then is refused: that
  // copy's seq is above the indexed one's, so after a power cut it would
  // outrank the delete's tombstone and the deleted key would be back.
  bool unsettled_locked(uint64_t hash) const;
  // What the card held at its first eviction (StoreStats' first_eviction_*).
  // `counted`: for each key of a store in flight then, the copy counted in
  // held_bytes (seq, payload bytes; 0, 0 if none), so a key counts once.
  // Guarded by mu_.
  struct FirstEviction {
    bool taken = false;
    uint64_t held_bytes = 0, inflight = 0, acked = 0, failed = 0;
    std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> counted;
  } first_eviction_;
  uint64_t next_seq_ = 1;  // 0 is never a store's: tombstones of never-indexed copies carry it
  bool evicting_logged_ = false;
  std::vector<Stale> pending_;  // tombstones that failed; guarded by mu_
  // The region the frontier is opening (-1: none; an evicted one or a free one) and the index entries its eviction
  // dropped, from evict_locked until the region's new header is durable (advance_frontier; one at a time:
  // frontier_mu_). Until then the old header and records still walk at the next open: a delete of one of these keys is
  // refused (Busy), not NotFound with nothing written (a delete undone by a crash, or by a failed header write, before
  // session 33: review33a F1), and a pending tombstone in that region is kept (retry_pending). Guarded by mu_.
  int64_t evicting_region_ = -1;
  std::vector<std::pair<uint64_t, IndexEntry>> evicting_;
  // The region's opening is over (its header durable, or the region put back): evicting_region_ = -1, and the next
  // retry_pending looks at the pending tombstones (pending_due_ = 0) if any: those of the region, not due while it
  // was being opened, are due or dropped now. Under mu_.
  void end_evicting_locked() {
    evicting_region_ = -1;
    if (!pending_.empty()) pending_due_ = 0;
  }
  // Slots of pending_'s capacity held by the operations in progress that may hand tombstones to it (a put: one per
  // item; a retry: one per tombstone it took out; an open's marks of older copies): pending_.capacity() >=
  // pending_.size() + pending_room_ always, so a tombstone or void that failed, or was never written (an exception
  // out of a put), goes to pending_ without allocating, never dropped (session 27). Guarded by mu_.
  size_t pending_room_ = 0;
  // Deletes whose tombstone is being written over the header of their
  // object, still indexed meanwhile: (hash, seq). A load reading that header
  // then may see it half-written: overwritten_meanwhile(). Guarded by mu_.
  std::vector<std::pair<uint64_t, uint64_t>> removing_;
  // Direct loads in progress, (hash, seq) each: they read the object's
  // header block in the same request as its payload, into the caller's
  // buffer, so its tombstone waits for them (write_tombstone) and a load of
  // an object in removing_ is a miss before it reads. Guarded by mu_.
  std::vector<std::pair<uint64_t, uint64_t>> reading_;
  std::condition_variable read_done_;  // an entry left reading_
  std::atomic<size_t> pending_count_{0};
  // Calls of retry_pending so far (each store and delete makes one), and a bound below every pending tombstone's
  // `due` (0 where one is due at once): below it a call finds none due without taking mu_ or allocating. Written
  // under mu_.
  std::atomic<uint64_t> pending_calls_{0}, pending_due_{0};
  // The calls of retry_pending that took mu_ to look at pending_ (pending_scans()). Guarded by mu_.
  uint64_t pending_scans_ = 0;

  struct Counters : OpCounters {
    std::atomic<uint64_t> evicted_objects{0}, evicted_regions{0}, checksum_failures{0}, io_errors{0};
    std::atomic<uint64_t> media_errors{0}, memory_failures{0};
    std::atomic<uint64_t> region_waits{0};       // StoreStats::region_waits
    std::atomic<uint64_t> writes_overlapped{0};  // StoreStats::writes_overlapped
  } counters_;
  // This store among every CardStore of the process (an IoContext's writer is of one: writer_of).
  static inline std::atomic<uint64_t> next_serial_{1};
  const uint64_t serial_ = next_serial_.fetch_add(1, std::memory_order_relaxed);
  std::atomic<bool> oversize_logged_{false};  // the first refused oversize object is logged
  // Regions retired since the open, their header block having refused a write (advance_frontier): stat
  // retired_regions. Guarded by mu_.
  uint64_t retired_regions_ = 0;
  uint64_t recovered_objects_ = 0;
  double recovery_seconds_ = 0;
  // The seqs recovery skipped at open past the highest seen, for records it
  // could neither hide nor read (unseen_seq_margin, or 0): recovery_seq_margin.
  uint64_t recovery_seq_margin_ = 0;
  // Damage recovery proved at open (recovery_damage.h): regions, and the
  // objects lost to it (their payload).
  uint64_t damaged_regions_ = 0, damage_lost_objects_ = 0, damage_lost_bytes_ = 0;
  std::vector<std::string> damaged_spans_;  // VerifyReport::damaged_spans (set at open)
  // The superblock's copies at the open (stats superblock_block_zero_bad, _backup_bad, _rewritten; set at open).
  bool superblock_block_zero_bad_ = false, superblock_backup_bad_ = false, superblock_rewritten_ = false;
  bool superblock_backup_blank_ = false;  // stats superblock_backup_blank: an older build's card, no backup yet
  std::string superblock_rewrite_error_;  // superblock_rewrite_error(): what failed where ("" if nothing did)
};

template <typename F>
inline bool CardStore::for_each_part_locked(uint32_t region, uint64_t offset, uint64_t footprint, F f) const {
  uint32_t r = region;
  uint64_t off = offset;
  while (footprint) {
    uint64_t len = std::min(footprint, region_bytes_ - off);
    f(r, len, region_offset(r) + off);
    footprint -= len;
    if (!footprint) break;
    r = regions_.next_of(r);
    if (r == UINT32_MAX) return false;
    off = kBlockSize;
  }
  return true;
}

}  // namespace adp
