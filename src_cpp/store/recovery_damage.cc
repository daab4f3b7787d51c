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
#include "store/key_index.h"
#include "store/recovery.h"
#include "util/aligned_buffer.h"
#include "util/amount.h"
#include "util/log.h"

namespace adp {
namespace {

constexpr uint64_t kLoggedRegions = 8;      // one ERROR line each, then a summary
constexpr uint64_t kScanChunk = 256 << 10;  // read at once behind damage (RegionBlocks)
constexpr size_t kListedSpans = 64;         // verify's lines, then how many more

bool all_zero(const uint8_t* block) { return block[0] == 0 && std::memcmp(block, block + 1, kBlockSize - 1) == 0; }

std::string u64(uint64_t v) { return std::to_string(v); }

std::string header_why(uint64_t epoch, const char* why) {
  return "an object header of this card under the region's epoch " + u64(epoch) + " " + why;
}

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
  scan->damage_why = "a region header of this card that does not check out (its checksum or region index)";
  scan->header_epoch = rh.epoch;
}

void note_cont_bytes_damage(const RegionHeader& rh, RegionScan* scan) {
  scan->damage = Damage::kRegionHeader;
  scan->damage_why =
      "a region header whose cont_bytes " + u64(rh.cont_bytes) + " is not 4 KiB blocks inside the region";
  scan->header_epoch = rh.epoch;
}

const char* check_walked_header(const uint8_t* block, const CardGeometry& g, uint64_t epoch, uint64_t off,
                                ObjectHeader* h) {
  // A record may span at most every region of the card, and none is longer than a largest region (an object is at
  // most kMaxObjectBytes, a pad at most its region): the index entry holds a payload in 29 bits (key_index.h).
  static_assert(kMaxRegionBytes < (uint64_t(1) << 29), "a walked record's payload fits an index entry");
  const uint64_t max_payload = std::min(uint64_t(g.num_regions) * g.region_bytes, kMaxRegionBytes);
  if (!decode_object_header(block, g.card_id, epoch, h))
    return "that fails its checksum (or names a key over 1024 bytes)";
  if (h->payload_bytes > max_payload)  // bounded before it is used
    return "whose payload_bytes is beyond the card or a largest record";
  if (record_continues(off, h->payload_bytes, g.region_bytes) != ((h->flags & kObjectContinues) != 0))
    return "whose continue flag disagrees with its length";
  // No build writes a seq past the index entry's 46 bits (a store there is refused: CardStore::reserve). Indexed
  // under its seq cut to 46 bits it could rank below an older copy of its key at a later open, and it would set the
  // next seq past the index's width (every store refused) or, at 2^64 - 1, wrap it to 0.
  if (h->seq > kMaxIndexSeq) return "whose seq is past an index entry's 46 bits";
  return nullptr;
}

bool damaged_object_header(const uint8_t* block, uint64_t card_id, uint64_t epoch) {
  ObjectHeader h;
  std::memcpy(&h, block, sizeof h);
  return std::memcmp(h.magic, kObjectMagic, 8) == 0 && h.card_id == card_id && h.epoch == epoch;
}

namespace {

// A region's blocks as the scans behind damage read them. Blocks read in a row (the look for the next header that
// checks out: mostly a record's payload) come kScanChunk at a time: a 4 KiB read per block made a card with one
// damaged 2 MiB record per region open 37 times slower than undamaged, 256 KiB reads 8 times
// (benchmarks/results/2026-12-04-1229-damage-open.md). The header a record's length points at, past what was read,
// is one block, as the walk reads it (scan_region). Without the memory for a chunk, a block at a time. A chunk
// whose read fails (an unreadable block somewhere in it) is read again a block at a time: the blocks in front of the
// unreadable one are found as the walk would find them, and only a read of the block asked for ends the look.
class RegionBlocks {
 public:
  RegionBlocks(const Device& dev, const CardGeometry& g, uint32_t r, uint8_t* block)
      : dev_(dev), base_(g.region_offset(r)), region_bytes_(g.region_bytes), block_(block) {
    chunked_ = chunk_.reserve(kScanChunk);
  }

  // The block at `off` of the region (off + kBlockSize <= region_bytes); `ahead`: read up to kScanChunk from it
  // where it is not read yet. nullptr where the read failed (*io).
  const uint8_t* at(uint64_t off, bool ahead, Status* io) {
    if (off < from_ || off + kBlockSize > from_ + len_) {
      len_ = ahead && chunked_ && off >= blockwise_until_ ? std::min(kScanChunk, region_bytes_ - off) : kBlockSize;
      buf_ = len_ > kBlockSize ? chunk_.data() : block_;
      from_ = off;
      *io = dev_.read(base_ + off, buf_, len_);
      if (!io->ok() && len_ > kBlockSize) {  // somewhere in the chunk: its blocks one by one
        blockwise_until_ = off + len_;
        len_ = kBlockSize;
        buf_ = block_;
        *io = dev_.read(base_ + off, buf_, len_);
      }
      if (!io->ok()) {
        len_ = 0;
        return nullptr;
      }
    }
    return buf_ + (off - from_);
  }

 private:
  const Device& dev_;
  const uint64_t base_, region_bytes_;
  uint8_t* const block_;
  AlignedBuffer chunk_;
  bool chunked_ = false;
  uint8_t* buf_ = nullptr;  // holds the region's bytes from_ to from_ + len_
  uint64_t from_ = 0, len_ = 0;
  uint64_t blockwise_until_ = 0;  // a chunk read from below here failed: one block at a time up to here
};

}  // namespace

uint64_t skip_damage(const Device& dev, const CardGeometry& g, uint32_t r, uint64_t epoch, uint64_t off,
                     const char* why, uint8_t* block, RegionScan* scan) {
  bool damaged = why != nullptr;  // a damaged span of this look is open (scan->spans.back())
  bool unreadable = !damaged;     // a block from `off` on could not be read
  if (damaged) {
    scan->damage = Damage::kObjectHeader;
    scan->spans.push_back({off, g.region_bytes, header_why(epoch, why)});
  }
  // Where the look ends (at the next header that checks out, or the region's end): a span with an unreadable
  // block in it is padded from `off` by a read-write open (recovery.cc), the whole look, not only from that block:
  // a later walk enters the span only at `off` (through the record in front), so the pad there hides every header
  // in it, one that reads right again included (its seq unseen by this open). Before session 33 an unreadable
  // block ended the walk (the rest of the region lost, padded to its end).
  auto end_at = [&](uint64_t at) {
    if (damaged) scan->spans.back().end = at;
    if (unreadable) scan->unreadable.push_back({off, at});
    return at;
  };
  RegionBlocks blocks(dev, g, r, block);
  for (uint64_t at = off + kBlockSize; at + kBlockSize <= g.region_bytes; at += kBlockSize) {
    Status io;
    const uint8_t* b = blocks.at(at, true, &io);
    if (!b) {  // no crash leaves an unreadable block: damage, stepped over as a damaged record's payload
      if (scan->io.ok()) scan->io = io;
      unreadable = true;
      continue;
    }
    ObjectHeader h;
    const char* bad = check_walked_header(b, g, epoch, at, &h);
    // A payload block of the damaged record, or older bytes (an older
    // epoch's records, a cut's hole): stepped over.
    if (bad && !damaged_object_header(b, g.card_id, epoch)) continue;
    if (!bad) return end_at(at);
    if (damaged) scan->spans.back().end = at;
    scan->damage = Damage::kObjectHeader;
    scan->spans.push_back({at, g.region_bytes, header_why(epoch, bad)});  // another damaged header: its own span
    damaged = true;
  }
  return end_at(g.region_bytes);
}

void find_behind_damage(const Device& dev, const CardGeometry& g, uint32_t r, uint64_t epoch, uint64_t from,
                        uint8_t* block, std::vector<RecoveredObject>* out) {
  RegionBlocks blocks(dev, g, r, block);
  bool ahead = true;  // looking for a header, not at one a record's length points at
  Status io;
  for (uint64_t off = from; off + kBlockSize <= g.region_bytes;) {
    const uint8_t* b = blocks.at(off, ahead, &io);
    if (!b) return;
    ObjectHeader h;
    ahead = check_walked_header(b, g, epoch, off, &h) != nullptr;  // the walk's check (a record it would follow)
    if (ahead) {
      off += kBlockSize;
      continue;
    }
    if (!(h.flags & (kObjectPad | kObjectDeleted)))
      out->push_back(recovered_record(b, h, r, off, (h.flags & kObjectContinues) != 0));
    off += object_footprint(h.payload_bytes);
  }
}

namespace {

// The bytes a damaged span holds: its blocks behind the header and, for a
// span that runs to the region's end, the continuation the regions the
// frontier opened next hold (the damaged record may be the region's last).
uint64_t span_bytes(const CardGeometry& g, const std::vector<RegionScan>& sc, const std::vector<uint32_t>& succ,
                    uint32_t r, const DamagedSpan& d) {
  uint64_t bytes = d.end - d.at - kBlockSize;
  if (d.end < g.region_bytes) return bytes;
  uint32_t cur = r;
  for (uint32_t hops = 0; hops < g.num_regions && succ[cur] < g.num_regions; hops++) {
    cur = succ[cur];
    bytes += sc[cur].cont_bytes;
    if (sc[cur].cont_bytes < g.region_bytes - kBlockSize) break;
  }
  return bytes;
}

// The ERROR line's account of region r's damaged object headers (after
// "region R, "), and what they cost: each one's record (its key unknown).
std::string object_damage_line(const CardGeometry& g, const std::vector<RegionScan>& sc,
                               const std::vector<uint32_t>& succ, uint32_t r, uint64_t* lost, uint64_t* lost_bytes,
                               std::vector<std::string>* listed) {
  std::string line;
  for (const DamagedSpan& d : sc[r].spans) {
    (*lost)++;
    *lost_bytes += span_bytes(g, sc, succ, r, d);
    listed->push_back("region " + u64(r) + ", offset " + u64(d.at) + " to " + u64(d.end) + ": " + d.why +
                      (d.end < g.region_bytes ? " (its record lost; the walk resumed at " + u64(d.end) + ")"
                                              : " (its record lost; no header checks out behind it)"));
    line +=
        (line.empty() ? "offset " + u64(d.at) + ": damage, not a crash's cut: " : "; then offset " + u64(d.at) + ": ");
    line += d.why;
    line += d.end < g.region_bytes ? "; the walk resumed at offset " + u64(d.end) +
                                         ", the next header of the region's epoch that checks out"
                                   : "; no header of the region's epoch checks out behind it";
  }
  return line + "; lost: " + u64(*lost) + " objects (" + log_amount(*lost_bytes) +
         "), the record of each damaged header (its key unknown, its bytes those up to where the walk resumed); " +
         u64(sc[r].objects.size()) + " records of the region kept";
}

}  // namespace

DamageTotals judge_damage(const Device& dev, const CardGeometry& g, const std::vector<uint32_t>& succ,
                          std::vector<RegionScan>* scans,
                          const std::function<bool(const RecoveredObject& object)>& newer_elsewhere) {
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
  std::vector<std::string> listed;
  AlignedBuffer block;
  if (!block.reserve(kBlockSize)) return t;
  for (uint32_t r = 0; r < g.num_regions; r++) {
    RegionScan& s = sc[r];
    if (s.damage == Damage::kNone) continue;
    uint64_t lost = 0, lost_bytes = 0;
    std::string line;
    if (s.damage == Damage::kObjectHeader) {
      line = object_damage_line(g, sc, succ, r, &lost, &lost_bytes, &listed);
    } else {
      // Its own epoch field (if the bytes are this card's header) or the one
      // its successor names: whichever finds more records.
      std::vector<RecoveredObject> behind;
      uint64_t epoch = 0;
      for (uint64_t e : {s.header_epoch, named_epoch[r]}) {
        std::vector<RecoveredObject> found;
        if (e && e != epoch) find_behind_damage(dev, g, r, e, kBlockSize, block.data(), &found);
        if (e && (epoch == 0 || found.size() > behind.size())) epoch = e, behind = std::move(found);
      }
      for (const RecoveredObject& f : behind)
        if (!newer_elsewhere(f)) lost++, lost_bytes += f.payload_bytes;
      line = "offset 0: damage, not a crash's cut: " + s.damage_why +
             "; the region is taken as free; lost: " + u64(lost) + " objects (" + log_amount(lost_bytes) +
             ") found behind it" + (epoch ? "" : " (its epoch unknown: none looked for)");
      listed.push_back("region " + u64(r) + ", offset 0 (its header) to " + u64(g.region_bytes) + ": " + s.damage_why +
                       " (the region taken as free: " + u64(lost) + " objects found behind it lost)");
    }
    t.regions++;
    t.objects += lost;
    t.bytes += lost_bytes;
    if (t.regions > kLoggedRegions) continue;
    ADP_ERROR("card %s: region %u, %s. The rest of the card is served (`lmcache-adp verify` reports it)",
              dev.path().c_str(), r, line.c_str());
  }
  if (t.regions > kLoggedRegions)
    ADP_ERROR("card %s: %" PRIu64 " damaged regions in all (the first %" PRIu64 " logged above): %" PRIu64
              " objects (%s) lost",
              dev.path().c_str(), t.regions, kLoggedRegions, t.objects, log_amount(t.bytes).c_str());
  if (listed.size() > kListedSpans) {
    const size_t more = listed.size() - kListedSpans;
    listed.resize(kListedSpans);
    listed.push_back(u64(more) + " more damaged spans (the ERROR lines of the open count them)");
  }
  t.spans = std::move(listed);
  return t;
}

}  // namespace adp
