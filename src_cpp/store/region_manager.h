// SPDX-License-Identifier: Apache-2.0
// RegionManager: the card's regions as the unit of allocation and eviction
// (as CacheLib Navy's RegionManager): which are free, which one is the write
// frontier (open for appending), which are sealed; the chain the frontier
// left (which region it moved to from each, for records that continue into
// the next region); pins held by readers and writers; the LRU clock and the
// choice of the region to evict.
//
// Not synchronized: the card store calls every method with its lock held
// (the index and the regions change together under that one lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace adp {

class RegionManager {
 public:
  enum class State : uint8_t { kFree, kOpen, kSealed };
  struct Region {
    State state = State::kFree;
    uint32_t pins = 0;  // readers/invalidators/writers in flight
    uint64_t epoch = 0;
    uint64_t write_offset = 0;  // next append offset within the region
    uint64_t live_bytes = 0;    // bytes of indexed objects in this region
    uint64_t last_access = 0;   // LRU clock
    // The region the frontier moved to from this one (and its epoch then):
    // the last record of this region continues there. UINT32_MAX if none.
    uint32_t next = UINT32_MAX;
    uint64_t next_epoch = 0;
    // A record at this offset was abandoned and its place could not be
    // marked (a pad write failed): recovery's walk of the region stops
    // there, so no store behind it may be acknowledged.
    uint64_t broken_at = UINT64_MAX;
    // The device's count of issued writes (Device::write_mark) before
    // this region's header was written under its epoch (0 for one the open
    // found): every write a record here depends on came after it. A failed
    // sync that returned after one of them was issued may have lost it (the
    // header, a record in front,
    // a pad): no store here is acknowledged then (its sync is given this
    // mark), and the frontier leaves it (CardStore::reserve).
    uint64_t open_mark = 0;
    std::vector<uint64_t> hashes;  // keys with bytes in this region under this epoch (for eviction)
    // Its header block refused a write when the frontier opened it (a bad block): never handed out or evicted
    // again in this process. Sealed (its objects still indexed and served, as before the failed open) or free
    // (never on the free list again). A reopen does not know it: the next open of the region fails and retires it
    // again (CardStore::advance_frontier).
    bool retired = false;
    // Scratch of others_may_unpin: false outside it.
    bool mine = false;
  };

  // The free list has room for every region from the start: returning a region to it (add_free, add_free_last)
  // never allocates, so never throws (session 26: a store's failure path gives its region back).
  explicit RegionManager(uint32_t num_regions) : regions_(num_regions) { free_.reserve(num_regions); }

  uint32_t size() const { return static_cast<uint32_t>(regions_.size()); }
  Region& operator[](uint32_t r) { return regions_[r]; }
  const Region& operator[](uint32_t r) const { return regions_[r]; }
  size_t free_count() const { return free_.size(); }

  // Takes a free region that is not pinned (a tombstone being written into it under its old epoch: it waits for
  // that write, CardStore::retry_pending); false if there is none.
  bool take_free(uint32_t* r);
  // Returns r to the free list (never written under its current epoch).
  void add_free(uint32_t r);
  // The same, but r is handed out after every other free region (its last
  // I/O failed).
  void add_free_last(uint32_t r);
  // The region to evict: an unpinned sealed one not retired, empty ones first,
  // then the least recently used. -1 if every region is open, pinned or retired.
  int64_t choose_victim() const;
  // Whether a region that choose_victim or take_free passes over for its pins (sealed and not retired, or free)
  // would be taken once they go, counting as never going the pins of `mine` and `mine_too` (regions the caller holds
  // pinned while it waits, each listed once a pin or more): a region one of them pins stays pinned whoever else lets
  // go of it. False: a wait for a region is futile. Allocates nothing.
  bool others_may_unpin(std::span<const uint32_t> mine, std::span<const uint32_t> mine_too);
  // Makes r open for appending under a new epoch (its old contents are no
  // longer indexed); returns the epoch. The first block is the region header.
  uint64_t open(uint32_t r, uint64_t header_bytes);
  // Seals r: no more appends; its key list is trimmed to size.
  void seal(uint32_t r);
  // Marks r used (reads, writes): the LRU clock.
  void touch(uint32_t r) { regions_[r].last_access = ++clock_; }
  void pin(uint32_t r) { regions_[r].pins++; }
  // True when the last pin went.
  bool unpin(uint32_t r) { return --regions_[r].pins == 0; }
  // The region after r in the frontier's chain if it is still the one the
  // frontier moved to (same epoch), else UINT32_MAX.
  uint32_t next_of(uint32_t r) const {
    const Region& reg = regions_[r];
    if (reg.next == UINT32_MAX || regions_[reg.next].epoch != reg.next_epoch) return UINT32_MAX;
    return reg.next;
  }

  // Recovery: region r was found sealed with data up to `end` under `epoch`.
  void restore_sealed(uint32_t r, uint64_t epoch, uint64_t end);
  // Recovery: every region was restored or left free; `next_epoch` is above
  // every epoch found. Free regions are handed out lowest first.
  void finish_recovery(uint64_t next_epoch);

 private:
  std::vector<Region> regions_;
  std::vector<uint32_t> free_;
  uint64_t next_epoch_ = 1;
  uint64_t clock_ = 0;
};

}  // namespace adp
