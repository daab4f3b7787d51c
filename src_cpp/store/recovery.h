// SPDX-License-Identifier: Apache-2.0
// Recovery: walks the regions of a card and reports the objects it finds, as
// CacheLib Navy's BlockCache recovers from its regions. Each region is a
// chain of records from its first record (after the continuation of the
// previous frontier region's last record); the walk stops at the first
// record that does not check out, so a torn or cut-off store is never found,
// except at damage no crash can leave (recovery_damage.h): there it resumes
// at the next header that checks out, and the damage costs its record only.
// A block it cannot read is no crash's cut either: the walk goes on behind it
// as behind damage (since session 33), and the span it stepped over is padded
// by a read-write open. Where a walk ended at a crash's cut, a read-write open
// pads it to the region's end (CardStore::pad_cuts), so no later walk finds
// what is behind (records whose seqs this open never saw);
// a region header the walk could not take is zeroed there, and the next
// epoch set past the one it may hold; where a pad or zeroing fails, the
// object headers behind it are zeroed and the next seq set past the
// highest there (CardStore::hide_behind; docs/card_format.md, Recovery, "A
// region header not walked").
// A last record that continues into the next region is reported with
// `spans`; the store checks that the regions it continues into are there. What the objects
// mean (which copy of a key wins) is the store's decision (CardStore::recover).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/device.h"
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
  // hash: index_hash of its key (store/index_hash.h), 0 for a tombstone
  // that names no key (`keyless`).
  uint64_t hash, seq, payload_bytes;
  uint32_t region, block;  // block: offset within the region / kBlockSize
  bool deleted;            // a tombstone: the key was deleted (or this copy superseded) at `seq`
  bool spans = false;      // continues past the region's end (the region's last record)
  // A tombstone without a key: written by a format-3 build (it deletes every
  // older copy of any key of hash_key `key_hash`), or over a damaged header
  // (key_hash 0: it names nothing).
  bool keyless = false;
  uint64_t key_hash = 0;  // hash_key of its key, as its header holds it
};

struct ObjectHeader;
// The record of header block `block` (decoded into h, not a pad) at `offset`
// in `region`, as recovery collects it.
RecoveredObject recovered_record(const uint8_t* block, const ObjectHeader& h, uint32_t region, uint64_t offset,
                                 bool spans);

// Damage the walk can prove, not a crash's cut (docs/card_format.md,
// Recovery, "Damaged media"): a block every write of which was a whole,
// valid record of this card and that no longer checks out.
enum class Damage : uint8_t {
  kNone,
  kRegionHeader,  // the region header: this card's, failing a check, or missing where the chain names the region
  kObjectHeader,  // an object header of this card under the region's epoch that fails a check: the walk went on behind
                  // it
};

// A damaged object header at `at` and the blocks behind it up to `end`, where
// the walk resumed at the next header that checks out (or the region's end):
// its record, key and length unknown, is what the damage cost.
struct DamagedSpan {
  uint64_t at = 0, end = 0;
  std::string why;  // what about the header does not check out
};

// Blocks the walk could not read, from `at` (where it looked for a header, or a block the look behind damage met)
// to `end` (where it resumed at the next header of the region's epoch that checks out, or the region's end): what
// they held (their records, seqs unseen) is lost. A read-write open pads the span (CardStore::pad_cuts), so no later
// walk, the block readable again, finds a record there whose seq this open never saw.
struct UnreadableSpan {
  uint64_t at = 0, end = 0;
};

struct RegionScan {
  bool valid = false;  // a region header of this card was found
  uint64_t epoch = 0;
  uint32_t prev_region = UINT32_MAX;  // the frontier came from this region (its epoch then: prev_epoch)
  uint64_t prev_epoch = 0;
  uint64_t cont_bytes = 0;  // bytes after the header that continue prev_region's last record
  uint64_t end = 0;         // offset after the last record that checked out
  // The walk ended here, before the region's end, at a crash's cut (a header that is not one of the region's epoch,
  // no damage); 0: it did not.
  uint64_t cut_at = 0;
  std::vector<RecoveredObject> objects;  // objects and tombstones, in write order
  // The first read that failed (damaged media): of the region header (the region is not walked), or of a block the
  // walk stepped over (`unreadable`).
  Status io;
  std::vector<UnreadableSpan> unreadable;  // in the region's order
  Damage damage = Damage::kNone;
  std::string damage_why;          // kRegionHeader: what about the header does not check out
  std::vector<DamagedSpan> spans;  // kObjectHeader: each damaged header, in the region's order
  // The header block is neither zero nor this card's: foreign bytes (the
  // device before its format), or damage if another region names this one.
  bool foreign_header = false;
  uint64_t header_epoch = 0;  // kRegionHeader: the epoch its records carry, as far as known (0: unknown)
};

// Scans every region with `threads` threads into scans[0..num_regions).
// Logs progress every 5 seconds. A region with a block that cannot be read
// carries the error in its `io`: damaged media costs the objects it holds,
// not the card (an unreadable object header: its own record).
Status scan_regions(const Device& dev, const CardGeometry& g, int threads, std::vector<RegionScan>* scans);

}  // namespace adp
