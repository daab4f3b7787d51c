// SPDX-License-Identifier: Apache-2.0
// Recovery: walks the regions of a card and reports the objects it finds, as
// CacheLib Navy's BlockCache recovers from its regions. Each region is a
// chain written in order; the walk stops at the first record that does not
// check out, so a torn or cut-off store is never found. What the objects
// mean (which copy of a key wins) is the store's decision (CardStore::recover).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/card_device.h"
#include "util/status.h"

namespace adp {

// Where the regions of a card lie (from its superblock).
struct CardGeometry {
  uint64_t card_id = 0;
  uint64_t data_offset = 0;
  uint64_t region_bytes = 0;
  uint32_t num_regions = 0;
  uint64_t region_offset(uint32_t r) const { return data_offset + uint64_t(r) * region_bytes; }
};

struct RecoveredObject {
  uint64_t hash, seq, payload_bytes;
  uint32_t region, block;  // block: offset within the region / kBlockSize
};

struct RegionScan {
  bool valid = false;  // a region header of this card was found
  uint64_t epoch = 0;
  uint64_t end = 0;                      // offset after the last record that checked out
  std::vector<RecoveredObject> objects;  // live (not deleted) objects, in write order
};

// Scans every region with `threads` threads into scans[0..num_regions).
// Logs progress every 5 seconds. Fails on the first I/O error.
Status scan_regions(const CardDevice& dev, const CardGeometry& g, int threads, std::vector<RegionScan>* scans);

}  // namespace adp
