// SPDX-License-Identifier: Apache-2.0
// Damage recovery can prove, as opposed to what a crash leaves (a torn or
// cut-off write): noted by the region walk (recovery.cc), judged against
// the frontier's chain, counted and logged once the index is built.
// docs/card_format.md, Recovery, "Damaged media", says what is proof.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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
// The walk's check of the block at `off` of a region under `epoch`: nullptr
// if it is a record the walk follows (decoded into *h), else what about it
// does not check out. Recovery's scans behind damage take the same check.
// (A load's check of an indexed object's header: CardStore::check_entry_header.)
const char* check_walked_header(const uint8_t* block, const CardGeometry& g, uint64_t epoch, uint64_t off,
                                ObjectHeader* h);
// Whether a block that failed check_walked_header is damage, not a crash's
// cut: an object header of this card (magic, card_id) under `epoch`.
bool damaged_object_header(const uint8_t* block, uint64_t card_id, uint64_t epoch);

// The walk of region r met a damaged object header at `off` (`why`), or a
// block there it could not read (why nullptr; scan->io set by the caller):
// reads the blocks behind it one by one until a header of `epoch` checks out
// and returns that offset, where the walk resumes (region_bytes: none did).
// Each damaged header met is a span of scan->spans, to the next one or to the
// resume. A block looked at that cannot be read is stepped over (its error
// kept in scan->io if the first; a read ahead that fails is read again a
// block at a time); where any could not be read, the look from `off` to the
// resume is a span of scan->unreadable. At most the region's blocks are read,
// and only in a damaged region.
uint64_t skip_damage(const Device& dev, const CardGeometry& g, uint32_t r, uint64_t epoch, uint64_t off,
                     const char* why, uint8_t* block, RegionScan* scan);

// The live records (objects, not tombstones or pads) of `epoch` found
// behind a damaged region header of region r: the blocks from `from` read
// ahead (256 KiB at a time) until a header of `epoch` checks out as the walk
// checks it (check_walked_header), then its length skipped to the next. What
// the damage cost, counted and logged, never indexed (the region's epoch and
// where its records begin are unknown). At most the region's blocks are read.
void find_behind_damage(const Device& dev, const CardGeometry& g, uint32_t r, uint64_t epoch, uint64_t from,
                        uint8_t* block, std::vector<RecoveredObject>* out);

struct DamageTotals {
  uint64_t regions = 0;  // regions found damaged
  // Objects lost to it: the record of each damaged object header, and the
  // objects found behind a damaged region header that no newer copy or
  // delete supersedes.
  uint64_t objects = 0;
  uint64_t bytes = 0;  // their payload (a damaged object header's: its span)
  // One line per damaged span, for verify: "region R, offset A to E: what
  // (what it cost)"; after kListedSpans, one line saying how many more.
  std::vector<std::string> spans;
};

// Marks the foreign region headers the chain names as damaged, counts what
// every damage cost (behind a damaged region header: newer_elsewhere(object),
// a newer copy or tombstone of that object's key was found elsewhere, so it
// is no loss), and logs one ERROR line per damaged region (the first
// 8, then a summary).
// succ[p]: the region the frontier opened after p (kNoRegion: none found),
// which holds the continuation of p's last record.
DamageTotals judge_damage(const Device& dev, const CardGeometry& g, const std::vector<uint32_t>& succ,
                          std::vector<RegionScan>* scans,
                          const std::function<bool(const RecoveredObject& object)>& newer_elsewhere);

}  // namespace adp
