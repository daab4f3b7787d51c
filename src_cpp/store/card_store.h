// SPDX-License-Identifier: Apache-2.0
// CardStore: the storage engine on the card (format: docs/card_format.md).
//
// The card is cut into equal regions. Each writer (an IoContext) appends
// objects to a region of its own, so a region is written strictly in order
// and recovery can walk it as a chain and stop at the first record that does
// not check out: a torn or cut-off store is never indexed. The in-memory
// index maps a 64-bit key hash to the object's place; the full key lives in
// the object's header block and is compared on every read, with both CRCs.
// When no region is free, the least recently used sealed region is evicted
// as a whole (its objects leave the index; its space is reused).
//
// Rooms (as CacheLib Navy divides its block cache): record encoding and
// decoding is in card_format, the regions (allocation, pins, victim choice)
// in region_manager, the walk of the card at open in recovery, verify in
// verify.cc; this class holds the index and the put/get/commit path.
//
// Thread-safety: all public methods may be called from any thread; each
// thread brings its own IoContext (staging memory, open region).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/store_types.h"
#include "store/card_device.h"
#include "store/card_format.h"
#include "store/key_index.h"
#include "store/region_manager.h"
#include "util/aligned_buffer.h"
#include "util/status.h"

namespace adp {

struct CardOptions {
  std::string path;
  uint64_t create_bytes = 0;  // size of a new image file; 0 = never create
  uint64_t region_bytes = 0;  // region size when formatting; 0 = chosen from the card size
  bool durable = true;        // fdatasync before a store is acknowledged
  int io_depth = 4;           // card I/O in flight at once
  int recovery_threads = 4;
};

class CardStore;

// Per-thread working state: staging memory and the region this thread appends to.
class IoContext {
 public:
  IoContext() = default;
  IoContext(const IoContext&) = delete;
  IoContext& operator=(const IoContext&) = delete;
  ~IoContext();

 private:
  friend class CardStore;
  CardStore* store_ = nullptr;
  AlignedBuffer staging_;
  AlignedBuffer header_;  // header and tail blocks of a zero-copy write
  int64_t open_region_ = -1;
};

struct VerifyReport {
  uint64_t checked = 0, bad = 0, repaired = 0, bytes = 0;
  std::vector<std::string> bad_objects;  // "region R offset O: reason"
};

class CardStore {
 public:
  // Opens the card at opts.path: formats it when blank or newly created,
  // otherwise recovers the index from it (logged with count and duration).
  static Status Open(const CardOptions& opts, std::unique_ptr<CardStore>* out);
  // Writes a fresh superblock (new card id): every object on the card is gone.
  static Status Format(const std::string& path, uint64_t create_bytes, uint64_t region_bytes);
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

  // Reads key and checks its header and key, then lets deliver() place the
  // payload, checking the payload CRC on the way; `into` says whether the
  // card is read before deliver() or by its copy() (see ReadInto). Ok:
  // delivered and intact. NotFound: a miss, a declined delivery, or a failed
  // checksum (counted, and the object is dropped). Otherwise an I/O error.
  Status get(IoContext& ctx, std::string_view key, const DeliverPayloadFn& deliver, ReadInto into = ReadInto::kStaging);
  // True if the card is memory (an image file on tmpfs or ramfs): a read
  // takes a memcpy's time, bounded by the object size.
  bool memory_speed() const { return device_->memory_backed(); }

  bool exists(std::string_view key);
  // True if the key was present and is now deleted on the card.
  bool remove(IoContext& ctx, std::string_view key);

  // Reads every indexed object and checks it as a load would. Bad objects
  // are reported, and dropped (as a failed load drops them) when `repair`.
  // progress(done, total) is called after each object.
  void verify(IoContext& ctx, bool repair, const std::function<void(uint64_t, uint64_t)>& progress,
              VerifyReport* report);

  StoreStats stats() const;
  const std::string& path() const { return device_->path(); }
  // Largest payload one object can hold.
  uint64_t max_object_bytes() const { return std::min(region_bytes_ - 2 * kBlockSize, kMaxObjectBytes); }

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
    uint64_t hash = 0;
  };
  // An older copy to be marked deleted on the card. Its region is pinned
  // while the tombstone is written; `guard` (or -1) is the region holding
  // the newer copy or delete, pinned until the tombstone is durable, so the
  // older copy cannot outlive what supersedes it.
  struct Stale {
    Location loc;
    int64_t guard;
  };

  CardStore(std::unique_ptr<Device> dev, const Superblock& sb, bool durable);
  Status recover(int threads);
  uint64_t region_offset(uint32_t r) const { return data_offset_ + uint64_t(r) * region_bytes_; }

  // Gives ctx an open region with at least `footprint` bytes left.
  Status reserve(IoContext& ctx, uint64_t footprint, uint32_t* region, uint64_t* offset, uint64_t* epoch);
  // A region for ctx with room for `footprint`: a parked one, a free one,
  // or one evicted for it (its new header written).
  Status open_region(IoContext& ctx, uint64_t footprint, uint32_t* region);
  void evict_locked(uint32_t r);
  // Seals ctx's region (its chain is broken: a write in it failed).
  void release_region(IoContext& ctx);
  // Parks ctx's region for the next writer (RegionManager::park).
  void park_region(IoContext& ctx);
  static constexpr uint64_t kMinParkRoom = 64 * 1024;
  void unpin(uint32_t r);
  // Writes object `it` at card offset `at`, the header with the CRC last.
  // For memory-speed cards. `mapped` (the extent prepared for a mapped
  // write; any memory): the payload is copied into the mapping and
  // checksummed in the same pass. Otherwise (memory 4 KiB aligned, at least
  // one block): payload pieces, each checksummed just before it is written.
  Status write_in_pieces(IoContext& ctx, uint64_t at, const PutItem& it, uint64_t epoch, uint64_t seq, bool mapped);
  // Marks the object at loc deleted on the card (region must be pinned).
  Status write_tombstone(IoContext& ctx, const Location& loc);
  // Writes the tombstones of `stale` (synced when durable), then unpins
  // their regions and guards. Those that fail go to pending_ (their guard
  // stays pinned) and are retried by retry_pending(). False if any failed.
  bool write_tombstones(IoContext& ctx, std::vector<Stale>& stale);
  void retry_pending(IoContext& ctx);
  void count_io_error() { counters_.io_errors++; }  // the device logs failing/working transitions
  void erase_entry_locked(uint64_t hash, const IndexEntry& e);
  // Reads the object of (hash, e) into ctx's staging and checks header, key
  // hash and payload CRC. Empty string if good, else the reason. *io is
  // NotFound (and the reason empty) when the object is no longer current:
  // evicted, replaced or deleted since e was looked up. That is no damage.
  // check_payload=false leaves the payload CRC to the caller (get fuses it
  // with the delivery copy). A 4 KiB aligned `payload_dst` receives the
  // payload (same I/O, checked there); otherwise it lands in staging.
  std::string read_and_check(IoContext& ctx, uint64_t hash, const IndexEntry& e, Status* io, bool check_payload,
                             uint8_t* payload_dst = nullptr);
  // Removes a damaged object from the index and marks it deleted on the card.
  void drop_damaged(IoContext& ctx, uint64_t hash, const IndexEntry& e);

  std::unique_ptr<Device> device_;
  const uint64_t card_id_;
  const uint64_t data_offset_;
  const uint64_t region_bytes_;
  const uint32_t num_regions_;
  const bool durable_;

  mutable std::mutex mu_;
  std::condition_variable unpinned_;
  RegionManager regions_;  // guarded by mu_
  KeyIndex index_;         // guarded by mu_
  uint64_t used_bytes_ = 0;
  uint64_t next_seq_ = 1;  // 0 is never a store's: tombstones of never-indexed copies carry it
  bool evicting_logged_ = false;
  std::vector<Stale> pending_;  // tombstones that failed; guarded by mu_
  std::atomic<size_t> pending_count_{0};

  struct Counters : OpCounters {
    std::atomic<uint64_t> evicted_objects{0}, evicted_regions{0}, checksum_failures{0}, io_errors{0};
    std::atomic<uint64_t> media_errors{0};
  } counters_;
  std::atomic<bool> oversize_logged_{false};  // the first refused oversize object is logged
  uint64_t recovered_objects_ = 0;
  double recovery_seconds_ = 0;
};

}  // namespace adp
