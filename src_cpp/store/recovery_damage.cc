// SPDX-License-Identifier: Apache-2.0
// Damage recovery can prove (docs/card_format.md, Recovery, "Damaged media"):
// what a crash cannot leave. Every write is of whole 4 KiB blocks, each block
// landing whole or not at all (as on a 4Kn device, and as the fault device
// of the crash tests cuts them), and every header block written is a valid
// record of this card. So a crash leaves at a record's place the block's
// older bytes (zeros, leftovers of an earlier epoch or format) or its new
// ones, never a header of this card's region epoch that fails its checksum;
// and a region header is written once per opening, synced before the
// frontier moves on, so a region another region names as the one the
// frontier came from holds a valid header of this card.
#include "store/recovery_damage.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "store/card_format.h"
#include "store/recovery.h"
#include "util/aligned_buffer.h"
#include "util/amount.h"
#include "util/log.h"

namespace adp {
namespace {

constexpr uint64_t kLoggedRegions = 8;  // one ERROR line each, then a summary

bool all_zero(const uint8_t* block) { return block[0] == 0 && std::memcmp(block, block + 1, kBlockSize - 1) == 0; }

std::string u64(uint64_t v) { return std::to_string(v); }

}  // namespace

void note_region_header_damage(const uint8_t* block, uint64_t card_id, RegionScan* scan) {
  if (all_zero(block)) return;  // never written: a free region
  RegionHeader rh;
  std::memcpy(&rh, block, sizeof rh);
  if (std::memcmp(rh.magic, kRegionMagic, 8) != 0 || rh.card_id != card_id) {
    scan->foreign_header = true;  // damage only if another region names this one (judge_damage)
    return;
  }
  scan->damage = Damage::kRegionHeader;
  scan->damage_at = 0;
  scan->damage_why = "a region header of this card that does not check out (its checksum or region index)";
  scan->header_epoch = rh.epoch;
}

void note_cont_bytes_damage(const RegionHeader& rh, RegionScan* scan) {
  scan->damage = Damage::kRegionHeader;
  scan->damage_at = 0;
  scan->damage_why =
      "a region header whose cont_bytes " + u64(rh.cont_bytes) + " is not 4 KiB blocks inside the region";
  scan->header_epoch = rh.epoch;
}

void note_object_header_damage(const uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t off, const char* why,
                               RegionScan* scan) {
  ObjectHeader h;
  std::memcpy(&h, block, sizeof h);
  if (std::memcmp(h.magic, kObjectMagic, 8) != 0 || h.card_id != card_id || h.epoch != epoch) return;
  scan->damage = Damage::kObjectHeader;
  scan->damage_at = off;
  scan->damage_why = std::string("an object header of this card under the region's epoch ") + u64(epoch) + " " + why;
}

void find_behind_damage(const Device& dev, const CardGeometry& g, uint32_t r, uint64_t epoch, uint64_t from,
                        uint8_t* block, std::vector<RecoveredObject>* out) {
  const uint64_t base = g.region_offset(r), max_payload = uint64_t(g.num_regions) * g.region_bytes;
  for (uint64_t off = from; off + kBlockSize <= g.region_bytes;) {
    ObjectHeader h;
    if (!dev.read(base + off, block, kBlockSize).ok()) return;
    if (!decode_object_header(block, g.card_id, epoch, &h) || h.payload_bytes > max_payload) {
      off += kBlockSize;
      continue;
    }
    if (!(h.flags & (kObjectPad | kObjectDeleted)))
      out->push_back({hash_key(object_key(block, h)), h.seq, h.payload_bytes, r,
                      static_cast<uint32_t>(off / kBlockSize), false, (h.flags & kObjectContinues) != 0});
    off += object_footprint(h.payload_bytes);
  }
}

DamageTotals judge_damage(const Device& dev, const CardGeometry& g, std::vector<RegionScan>* scans,
                          const std::function<bool(uint64_t hash, uint64_t seq)>& newer_elsewhere) {
  std::vector<RegionScan>& sc = *scans;
  // A foreign header block where a valid region of this card says the
  // frontier came from is damage: that region's header was written (and
  // synced) by this card before the frontier moved on, and only a valid
  // header of this card is ever written over it. named_epoch: the epoch a
  // region had when the frontier left it, as its successor names it (the
  // newest, if several do), which its records carry where its own header's
  // epoch field cannot be trusted.
  std::vector<uint64_t> named_epoch(g.num_regions, 0);
  for (const RegionScan& s : sc) {
    if (!s.valid || s.prev_region >= g.num_regions) continue;
    named_epoch[s.prev_region] = std::max(named_epoch[s.prev_region], s.prev_epoch);
    RegionScan& p = sc[s.prev_region];
    if (!p.foreign_header || !p.io.ok()) continue;
    if (p.damage == Damage::kNone)
      p.damage_why = "not a region header of this card, though region " + std::to_string(&s - sc.data()) +
                     " names it as the region the frontier came from";
    p.damage = Damage::kRegionHeader;
  }
  DamageTotals t;
  AlignedBuffer block;
  if (!block.reserve(kBlockSize)) return t;
  for (uint32_t r = 0; r < g.num_regions; r++) {
    RegionScan& s = sc[r];
    if (s.damage == Damage::kNone) continue;
    std::vector<RecoveredObject> behind;
    uint64_t epoch = s.epoch;
    if (s.damage == Damage::kObjectHeader) {
      find_behind_damage(dev, g, r, epoch, s.damage_at + kBlockSize, block.data(), &behind);
    } else {
      // Its own epoch field (if the bytes are this card's header) or the one
      // its successor names: whichever finds more records.
      epoch = 0;
      for (uint64_t e : {s.header_epoch, named_epoch[r]}) {
        std::vector<RecoveredObject> found;
        if (e && e != epoch) find_behind_damage(dev, g, r, e, kBlockSize, block.data(), &found);
        if (e && (epoch == 0 || found.size() > behind.size())) epoch = e, behind = std::move(found);
      }
    }
    uint64_t lost = 0, lost_bytes = 0;
    for (const RecoveredObject& f : behind)
      if (!newer_elsewhere(f.hash, f.seq)) lost++, lost_bytes += f.payload_bytes;
    t.regions++;
    t.objects += lost;
    t.bytes += lost_bytes;
    if (t.regions > kLoggedRegions) continue;
    std::string what =
        s.damage == Damage::kRegionHeader
            ? "the region is taken as free"
            : "the walk of the region ends there (" + std::to_string(s.objects.size()) + " records before it are kept)";
    ADP_ERROR("card %s: region %u, offset %" PRIu64 ": damage, not a crash's cut: %s; %s; lost: %s%" PRIu64
              " objects (%s) found behind it%s. The rest of the card is served (`lmcache-adp verify` reports it)",
              dev.path().c_str(), r, s.damage_at, s.damage_why.c_str(), what.c_str(),
              s.damage == Damage::kObjectHeader ? "the record there and " : "", lost, log_amount(lost_bytes).c_str(),
              epoch ? "" : " (its epoch unknown: none looked for)");
  }
  if (t.regions > kLoggedRegions)
    ADP_ERROR("card %s: %" PRIu64 " damaged regions in all (the first %" PRIu64 " logged above): %" PRIu64
              " objects (%s) lost",
              dev.path().c_str(), t.regions, kLoggedRegions, t.objects, log_amount(t.bytes).c_str());
  return t;
}

}  // namespace adp
