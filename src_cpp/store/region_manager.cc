// SPDX-License-Identifier: Apache-2.0
#include "store/region_manager.h"

#include <algorithm>
#include <cstddef>
#include <functional>

namespace adp {

bool RegionManager::take_free(uint32_t* r) {
  // The next in order that no one has pinned: a free region is pinned only by a tombstone being written into it
  // (retry_pending: an eviction's that did not land, under the region's old epoch). Handed out meanwhile, the
  // region would be opened under a new epoch and written, and the late tombstone land on a new record's header
  // (card_crash_mt_test's live checksum failure, session 34). Erasing from a vector allocates nothing.
  for (size_t i = free_.size(); i-- > 0;) {
    if (regions_[free_[i]].pins) continue;
    *r = free_[i];
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
  }
  return false;
}

void RegionManager::add_free(uint32_t r) {
  regions_[r].state = State::kFree;
  free_.push_back(r);
}

void RegionManager::add_free_last(uint32_t r) {
  regions_[r].state = State::kFree;
  free_.insert(free_.begin(), r);
}

int64_t RegionManager::choose_victim() const {
  int64_t victim = -1;
  for (uint32_t i = 0; i < size(); i++) {
    const Region& c = regions_[i];
    if (c.state != State::kSealed || c.pins || c.retired) continue;
    if (victim < 0) {
      victim = i;
      continue;
    }
    const Region& v = regions_[victim];
    bool c_empty = c.live_bytes == 0, v_empty = v.live_bytes == 0;
    if (c_empty != v_empty ? c_empty : c.last_access < v.last_access) victim = i;
  }
  return victim;
}

bool RegionManager::others_may_unpin(std::span<const uint32_t> mine, std::span<const uint32_t> mine_too) {
  for (uint32_t r : mine) regions_[r].mine = true;
  for (uint32_t r : mine_too) regions_[r].mine = true;
  bool may = false;
  for (const Region& c : regions_)
    may |= c.pins && !c.mine && !c.retired && (c.state == State::kSealed || c.state == State::kFree);
  for (uint32_t r : mine) regions_[r].mine = false;
  for (uint32_t r : mine_too) regions_[r].mine = false;
  return may;
}

uint64_t RegionManager::open(uint32_t r, uint64_t header_bytes) {
  Region& reg = regions_[r];
  reg.state = State::kOpen;
  reg.epoch = next_epoch_++;
  reg.write_offset = header_bytes;
  reg.live_bytes = 0;
  reg.last_access = ++clock_;
  reg.next = UINT32_MAX;
  reg.next_epoch = 0;
  reg.broken_at = UINT64_MAX;
  return reg.epoch;
}

void RegionManager::seal(uint32_t r) {
  regions_[r].state = State::kSealed;
  regions_[r].hashes.shrink_to_fit();
}

void RegionManager::restore_sealed(uint32_t r, uint64_t epoch, uint64_t end) {
  Region& reg = regions_[r];
  reg.state = State::kSealed;
  reg.epoch = epoch;
  reg.write_offset = end;
  reg.last_access = epoch;  // eviction order after restart: write order
}

void RegionManager::finish_recovery(uint64_t next_epoch) {
  next_epoch_ = std::max(next_epoch_, next_epoch);
  clock_ = next_epoch_;
  std::sort(free_.begin(), free_.end(), std::greater<uint32_t>());  // hand out low regions first
}

}  // namespace adp
