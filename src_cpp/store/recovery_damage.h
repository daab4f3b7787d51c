// SPDX-License-Identifier: Apache-2.0
// Damage recovery can prove, as opposed to what a crash leaves (a torn or
// cut-off write): noted by the region walk (recovery.cc), judged against
// the frontier's chain, counted and logged once the index is built.
// docs/card_format.md, Recovery, "Damaged media", says what is proof.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "store/card_format.h"
#include "store/recovery.h"

namespace adp {

// The header block of a region did not decode: zeros are a free region,
// this card's magic and id are damage, anything else is foreign (damage
// only if the chain names the region: judge_damage).
void note_region_header_damage(const uint8_t* block, uint64_t card_id, RegionScan* scan);
// A region header of this card whose cont_bytes is out of bounds.
void note_cont_bytes_damage(const RegionHeader& rh, RegionScan* scan);
// The walk ended at `off` on a block that does not check out (`why`): damage
// if it is an object header of this card under the region's `epoch`.
void note_object_header_damage(const uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t off, const char* why,
                               RegionScan* scan);

// The live records (objects, not tombstones or pads) of `epoch` found
// behind a damaged block of region r: one read per 4 KiB block from `from`
// until a header of `epoch` checks out, then its length skipped. What the
// damage cost, counted and logged, never indexed (the walk's order of
// acknowledgement ends at the damage). At most the region's blocks are read.
void find_behind_damage(const Device& dev, const CardGeometry& g, uint32_t r, uint64_t epoch, uint64_t from,
                        uint8_t* block, std::vector<RecoveredObject>* out);

struct DamageTotals {
  uint64_t regions = 0;  // regions found damaged
  uint64_t objects = 0;  // objects found behind the damage that no newer copy or delete supersedes
  uint64_t bytes = 0;    // their payload
};

// Marks the foreign region headers the chain names as damaged, looks behind
// every damage for what it cost (newer_elsewhere(hash, seq): a newer copy or
// tombstone of that key was found elsewhere, so that object is no loss), and
// logs one ERROR line per damaged region (the first 8, then a summary).
DamageTotals judge_damage(const Device& dev, const CardGeometry& g, std::vector<RegionScan>* scans,
                          const std::function<bool(uint64_t hash, uint64_t seq)>& newer_elsewhere);

}  // namespace adp
