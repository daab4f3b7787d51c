// SPDX-License-Identifier: Apache-2.0
// KeyIndex: the in-memory index of a card, key hash (index_hash: SipHash
// under a per-process secret, store/index_hash.h) -> where the object is.
// An open-addressing hash table (linear probing, backward-shift deletion) of
// 24-byte slots held in one array: no node per object and no bucket array,
// so about 24 / load bytes per object. The table grows by 1.5x when 3/4 full
// (any size, not a power of two: a slot is picked by multiply-shift), so the
// load stays between 1/2 and 3/4: 32 to 48 bytes per object, and a lookup of
// an absent key probes a few slots on average (8.5 at 3/4). The interface is the part of std::unordered_map
// the store uses: find() returns a pointer to the slot (nullptr = end()),
// valid until the next insert or erase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

namespace adp {

// A block number fits 17 bits (regions up to 512 MiB), a payload 29 (objects
// up to 512 MiB), a region number 20 (kMaxIndexRegions regions); 16 bits are
// spare (format 3's builds of session 20 kept a 16-bit key tag there, made
// redundant by the keyed index hash: store/index_hash.h).
struct IndexEntry {
  IndexEntry() : seq(0), block(0), spare0(0), region(0), spare1(0), payload_bytes(0), spare2(0) {}
  IndexEntry(uint32_t region_, uint32_t block_, uint32_t payload_bytes_, uint64_t seq_)
      : seq(seq_), block(block_), spare0(0), region(region_), spare1(0), payload_bytes(payload_bytes_), spare2(0) {}
  uint64_t seq : 46;    // card-wide store sequence (7e13 stores)
  uint64_t block : 17;  // offset within the region / 4 KiB (regions up to 512 MiB)
  uint64_t spare0 : 1;
  uint32_t region : 20;
  uint32_t spare1 : 12;
  uint32_t payload_bytes : 29;
  uint32_t spare2 : 3;
};
static_assert(sizeof(IndexEntry) == 16, "index entry layout");
// Regions a card may have: the index holds region numbers in 20 bits, and
// all ones marks an empty slot.
constexpr uint32_t kMaxIndexRegions = (1u << 20) - 1;
constexpr uint64_t kMaxIndexSeq = (1ull << 46) - 1;

class KeyIndex {
 public:
  struct Slot {
    uint64_t first;     // index_hash of the key
    IndexEntry second;  // region == kEmpty: unused slot
  };
  static_assert(sizeof(Slot) == 24, "index slot layout");
  using iterator = Slot*;

  KeyIndex() { rehash(16); }
  KeyIndex(const KeyIndex&) = delete;
  KeyIndex& operator=(const KeyIndex&) = delete;

  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }
  static iterator end() { return nullptr; }

  iterator find(uint64_t h) const {
    for (size_t i = home(h);; i = next(i)) {
      Slot& s = slots_[i];
      if (s.second.region == kEmpty) return nullptr;
      if (s.first == h) return &s;
    }
  }
  // Inserts (h, e) if h is absent; returns the slot and whether it inserted.
  std::pair<iterator, bool> try_emplace(uint64_t h, const IndexEntry& e) {
    if ((size_ + 1) * 4 > cap_ * 3) rehash(cap_ + cap_ / 2);
    for (size_t i = home(h);; i = next(i)) {
      Slot& s = slots_[i];
      if (s.second.region == kEmpty) {
        s.first = h;
        s.second = e;
        size_++;
        return {&s, true};
      }
      if (s.first == h) return {&s, false};
    }
  }
  void emplace(uint64_t h, const IndexEntry& e) { try_emplace(h, e); }
  bool erase(uint64_t h) {
    iterator it = find(h);
    if (!it) return false;
    size_t i = static_cast<size_t>(it - slots_.get());
    // Backward shift: pull later members of the probe run into the hole.
    for (size_t j = next(i);; j = next(j)) {
      Slot& s = slots_[j];
      if (s.second.region == kEmpty) break;
      size_t k = home(s.first);
      // s may move to i if its home is not in (i, j] (cyclically).
      bool movable = i <= j ? (k <= i || k > j) : (k <= i && k > j);
      if (movable) {
        slots_[i] = s;
        i = j;
      }
    }
    slots_[i].second.region = kEmpty;
    size_--;
    // Shrinking is optional: without memory for the smaller table this one is kept (an erase never throws).
    if (cap_ > 16 && size_ * 5 < cap_) try {
        rehash(cap_ / 2);
      } catch (const std::bad_alloc&) {
      }
    return true;
  }
  // Makes room for n entries: an insert up to n entries then allocates nothing (cannot throw). Throws
  // std::bad_alloc (the table unchanged) if the larger table cannot be allocated.
  void reserve(size_t n) {
    size_t cap = cap_;
    while ((n + 1) * 4 > cap * 3) cap += cap / 2;
    if (cap != cap_) rehash(cap);
  }
  template <typename F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < cap_; i++)
      if (slots_[i].second.region != kEmpty) f(slots_[i].first, slots_[i].second);
  }
  // Bytes of memory the table holds.
  size_t memory_bytes() const { return capacity() * sizeof(Slot); }

 private:
  static constexpr uint32_t kEmpty = kMaxIndexRegions;  // no region has this number
  size_t home(uint64_t h) const {
    return static_cast<size_t>((static_cast<unsigned __int128>(h * 0x9E3779B97F4A7C15ull) * cap_) >> 64);
  }
  size_t next(size_t i) const { return i + 1 == cap_ ? 0 : i + 1; }
  // Strong guarantee: the new table is allocated before the old one is touched, so a std::bad_alloc leaves the
  // index as it was (before session 26 the old table was moved out first and lost).
  void rehash(size_t cap) {
    std::unique_ptr<Slot[]> fresh(new Slot[cap]);
    std::unique_ptr<Slot[]> old = std::move(slots_);
    size_t old_cap = old ? cap_ : 0;
    slots_ = std::move(fresh);
    for (size_t i = 0; i < cap; i++) slots_[i].second.region = kEmpty;
    cap_ = cap;
    size_ = 0;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i].second.region != kEmpty) try_emplace(old[i].first, old[i].second);
  }

  std::unique_ptr<Slot[]> slots_;
  size_t cap_ = 0;
  size_t size_ = 0;
};

}  // namespace adp
