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
// Thread-safety: all public methods may be called from any thread; each
// thread brings its own IoContext (staging memory, open region).
#pragma once

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

#include "store/card_device.h"
#include "store/card_format.h"
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

struct StoreStats {
  uint64_t capacity_bytes = 0, used_bytes = 0, objects = 0;
  uint64_t region_bytes = 0, num_regions = 0, free_regions = 0;
  uint64_t hits = 0, misses = 0, stores = 0, store_failures = 0, deletes = 0;
  uint64_t evicted_objects = 0, evicted_regions = 0, checksum_failures = 0, io_errors = 0;
  uint64_t bytes_written = 0, bytes_read = 0;
  uint64_t recovered_objects = 0;
  double recovery_seconds = 0;
  bool healthy = true;  // false while the card's most recent I/O failed
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
  f("stores", st.stores);
  f("store_failures", st.store_failures);
  f("deletes", st.deletes);
  f("evicted_objects", st.evicted_objects);
  f("evicted_regions", st.evicted_regions);
  f("checksum_failures", st.checksum_failures);
  f("io_errors", st.io_errors);
  f("bytes_written", st.bytes_written);
  f("bytes_read", st.bytes_read);
  f("recovered_objects", st.recovered_objects);
  f("recovery_seconds", st.recovery_seconds);
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

// Copies a loaded payload to dst while checking its CRC (one pass over the
// bytes); false if the payload is damaged (dst then holds the damaged bytes).
using CopyFn = std::function<bool(uint8_t* dst)>;
// Called by get() once an object's header has checked out: chooses where its
// `size` bytes go and calls copy(dst), or declines by returning false.
using DeliverPayloadFn = std::function<bool(size_t size, const CopyFn& copy)>;

struct PutItem {
  std::string_view key;
  const uint8_t* data;
  size_t size;
};

class CardStore {
 public:
  // Opens the card at opts.path: formats it when blank or newly created,
  // otherwise recovers the index from it (logged with count and duration).
  static Status Open(const CardOptions& opts, std::unique_ptr<CardStore>* out);
  // Writes a fresh superblock (new card id): every object on the card is gone.
  static Status Format(const std::string& path, uint64_t create_bytes, uint64_t region_bytes);
  ~CardStore();

  // Stores items[0..n). results[i] says how item i went. Objects become
  // visible only after all their bytes are written (and synced if durable)
  // and only if still_wanted() is true at that moment; a caller that gave up
  // (deadline) gets nothing indexed.
  void put(IoContext& ctx, const PutItem* items, size_t n, Status* results, const std::function<bool()>& still_wanted);

  // Reads key and checks its header and key, then lets deliver() place the
  // payload, checking the payload CRC while it is copied. Ok: delivered and
  // intact. NotFound: a miss, a declined delivery, or a failed checksum
  // (counted, and the object is dropped). Otherwise an I/O error.
  Status get(IoContext& ctx, std::string_view key, const DeliverPayloadFn& deliver);

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
  uint64_t max_object_bytes() const { return region_bytes_ - 2 * kBlockSize; }

  // Validates a key against the format's bounds.
  static Status check_key(std::string_view key);

 private:
  friend class IoContext;
  enum class RegionState : uint8_t { kFree, kOpen, kSealed };
  struct Region {
    RegionState state = RegionState::kFree;
    uint32_t pins = 0;  // readers/invalidators in flight
    uint64_t epoch = 0;
    uint64_t write_offset = 0;     // next append offset within the region
    uint64_t live_bytes = 0;       // footprint of indexed objects
    uint64_t last_access = 0;      // LRU clock
    std::vector<uint64_t> hashes;  // keys written under this epoch (for eviction)
  };
  struct IndexEntry {
    uint32_t region;
    uint32_t block;  // offset within region / kBlockSize
    uint32_t payload_bytes;
    uint32_t reserved;
    uint64_t seq;
  };
  struct Location {
    uint32_t region;
    uint64_t offset;
    uint64_t epoch;
    uint64_t seq;
    uint64_t payload_bytes;
  };

  CardStore(std::unique_ptr<CardDevice> dev, const Superblock& sb, bool durable);
  Status recover(int threads);
  uint64_t region_offset(uint32_t r) const { return data_offset_ + uint64_t(r) * region_bytes_; }

  // Gives ctx an open region with at least `footprint` bytes left.
  Status reserve(IoContext& ctx, uint64_t footprint, uint32_t* region, uint64_t* offset, uint64_t* epoch);
  Status open_region(IoContext& ctx, uint32_t* region);
  void evict_locked(uint32_t r);
  void release_region(IoContext& ctx);
  void unpin(uint32_t r);
  // Marks the object at loc deleted on the card (region must be pinned).
  Status write_tombstone(IoContext& ctx, const Location& loc);
  void count_io_error() { counters_.io_errors++; }  // the device logs failing/working transitions
  void erase_entry_locked(uint64_t hash, const IndexEntry& e);
  // Reads the object of (hash, e) into ctx's staging and checks header, key
  // hash and payload CRC. Empty string if good, else the reason. *io is
  // NotFound (and the reason empty) when the object is no longer current:
  // evicted, replaced or deleted since e was looked up. That is no damage.
  // check_payload=false leaves the payload CRC to the caller (get fuses it
  // with the delivery copy).
  std::string read_and_check(IoContext& ctx, uint64_t hash, const IndexEntry& e, Status* io, bool check_payload);
  // Removes a damaged object from the index and marks it deleted on the card.
  void drop_damaged(IoContext& ctx, uint64_t hash, const IndexEntry& e);

  std::unique_ptr<CardDevice> device_;
  const uint64_t card_id_;
  const uint64_t data_offset_;
  const uint64_t region_bytes_;
  const uint32_t num_regions_;
  const bool durable_;

  mutable std::mutex mu_;
  std::condition_variable unpinned_;
  std::vector<Region> regions_;
  std::vector<uint32_t> free_regions_;
  std::unordered_map<uint64_t, IndexEntry> index_;
  uint64_t used_bytes_ = 0;
  uint64_t next_epoch_ = 1;
  uint64_t next_seq_ = 1;
  uint64_t clock_ = 0;
  bool evicting_logged_ = false;

  struct Counters : OpCounters {
    std::atomic<uint64_t> evicted_objects{0}, evicted_regions{0}, checksum_failures{0}, io_errors{0};
  } counters_;
  std::atomic<bool> oversize_logged_{false};  // the first refused oversize object is logged
  uint64_t recovered_objects_ = 0;
  double recovery_seconds_ = 0;
};

}  // namespace adp
