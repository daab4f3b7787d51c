// SPDX-License-Identifier: Apache-2.0
#include "store/region_manager.h"

#include <algorithm>
#include <functional>

namespace adp {

bool RegionManager::take_free(uint32_t* r) {
  if (free_.empty()) return false;
  *r = free_.back();
  free_.pop_back();
  return true;
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
