// SPDX-License-Identifier: Apache-2.0
// RegionManager: the card's regions as the unit of allocation and eviction
// (as CacheLib Navy's RegionManager): which are free, which are open for
// appending, which are sealed; pins held by readers and writers; the LRU
// clock and the choice of the region to evict.
//
// Not synchronized: the card store calls every method with its lock held
// (the index and the regions change together under that one lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace adp {

class RegionManager {
 public:
  enum class State : uint8_t { kFree, kOpen, kSealed };
  struct Region {
    State state = State::kFree;
    bool leased = false;  // open and held by a writer (not parked)
    uint32_t pins = 0;    // readers/invalidators/writers in flight
    uint64_t epoch = 0;
    uint64_t write_offset = 0;     // next append offset within the region
    uint64_t live_bytes = 0;       // footprint of indexed objects
    uint64_t last_access = 0;      // LRU clock
    std::vector<uint64_t> hashes;  // keys written under this epoch (for eviction)
  };

  explicit RegionManager(uint32_t num_regions) : regions_(num_regions) {}

  uint32_t size() const { return static_cast<uint32_t>(regions_.size()); }
  Region& operator[](uint32_t r) { return regions_[r]; }
  const Region& operator[](uint32_t r) const { return regions_[r]; }
  size_t free_count() const { return free_.size(); }

  // Takes a free region; false if none is free.
  bool take_free(uint32_t* r);
  // Returns r to the free list (never written under its current epoch).
  void add_free(uint32_t r);
  // The same, but r is handed out after every other free region (its last
  // I/O failed).
  void add_free_last(uint32_t r);
  // The region to evict: an unpinned sealed one, empty ones first, then the
  // least recently used. -1 if every region is open or pinned.
  int64_t choose_victim() const;
  // Makes r open for appending under a new epoch (its old contents are no
  // longer indexed); returns the epoch. The first block is the region header.
  uint64_t open(uint32_t r, uint64_t header_bytes);
  // Called when r's writer leaves it: sealed if anything was written, else free.
  void release(uint32_t r, uint64_t header_bytes);
  // Called when r's writer is done with it for now: r stays open for
  // appending, and the next writer that needs room takes it (take_idle), so
  // writers between stores hold no region back from use. Sealed instead when
  // less than `min_room` is left; free if nothing was written.
  void park(uint32_t r, uint64_t header_bytes, uint64_t region_bytes, uint64_t min_room);
  // Takes the parked region with the least room that still fits `footprint`.
  // Parked regions too full for it are sealed (so they can be evicted).
  bool take_idle(uint64_t footprint, uint64_t region_bytes, uint32_t* r);
  // Seals r: no more appends; its key list is trimmed to size.
  void seal(uint32_t r);
  // Seals every parked region (when nothing else can be evicted).
  bool seal_idle();
  // True if a region held by a writer now has room for `need` bytes: once
  // parked, it may take an object without an eviction.
  bool leased_with_room(uint64_t need, uint64_t region_bytes) const;
  // A region just opened could not be used (its header write failed): free,
  // handed out after every other free region.
  void fail_open(uint32_t r);
  // Marks r used (reads, writes): the LRU clock.
  void touch(uint32_t r) { regions_[r].last_access = ++clock_; }
  void pin(uint32_t r) { regions_[r].pins++; }
  // True when the last pin went.
  bool unpin(uint32_t r) { return --regions_[r].pins == 0; }

  // Recovery: region r was found sealed with data up to `end` under `epoch`.
  void restore_sealed(uint32_t r, uint64_t epoch, uint64_t end);
  // Recovery: every region was restored or left free; `next_epoch` is above
  // every epoch found. Free regions are handed out lowest first.
  void finish_recovery(uint64_t next_epoch);

 private:
  std::vector<Region> regions_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> idle_;  // parked open regions
  uint64_t next_epoch_ = 1;
  uint64_t clock_ = 0;
};

}  // namespace adp
