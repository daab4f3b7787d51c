// SPDX-License-Identifier: Apache-2.0
// A card-image fuzzer (DESIGN.md: checksums, atomic visibility, recovery after any restart, "a bad block costs the
// objects on it, never the card"). A small card (test_card.h's small_card: 8 regions of 1 MiB) on a fault device
// is filled by one of six workloads (objects of 3 KB to 1.5 MiB, some continuing into later regions, some keys
// stored again, some deleted, the card evicting), then for each seed of a range: a copy of its image is damaged
// (bytes flipped, 4 KiB blocks zeroed or made random, its tail cut off, blocks that cannot be read or written
// through the FaultDevice, an object header block put back as it was before its tombstone: a lost write), aimed at
// the superblock and its backup, region headers, object headers, tombstones and payload; then it is opened read-only
// (what `lmcache-adp status` and `verify` do) and read-write, verified, and every key loaded; old keys are deleted and
// stored again and new ones stored; a third of the seeds damage it more (while it is open, or once closed), at half
// of them the read errors pass, and the card is opened once more.
//
// What the format promises, and what is checked (docs/card_format.md, Recovery):
//   - An open either succeeds or refuses with a Status that says why; it refuses only where both copies of the
//     superblock (block 0 and its backup at 1 MiB - 4 KiB, session 39) or the card's size were damaged (a damaged
//     region or record, or one copy of the superblock, costs what it holds, never the card), and where block 0
//     holds readable bytes that are not a superblock (not blank, not torn) beside a valid backup: damage or another
//     program's data, which no open tells apart (fd39): every open refuses it, writing nothing, naming
//     `verify --repair`, and the open with restore_block_zero (what --repair passes) serves the card as the backup
//     has it. No crash, no hang (an alarm per seed), no exception out of the store.
//   - A load is a miss or exactly the bytes of the key's newest copy the undamaged card served. Every record
//     checks a CRC32C and a tombstone is written over the very header block of the copy it deletes, so damage
//     that only destroys (flips, zeros, garbage, unreadable blocks, a cut tail) cannot bring back an older copy
//     of a key stored again or deleted: that copy's own header is a tombstone already. The one way back is
//     damage that puts back a header block's older bytes (a lost write of its tombstone): then the format can
//     promise no more than that copy's bytes, and only while no newer record of its key (copy or tombstone) is
//     still there to outrank it. A copy that damage put back while such a newer record is intact is never
//     served.
//   - A copy whose every block is intact (its header, payload, the headers of the regions it lies in) and whose
//     region's walk reaches it (no cut-like damage in front of it there: a zeroed or foreign block, or an object
//     header whose magic, card_id or epoch changed, all of which read as a crash's cut) is served, by the
//     read-only open and the read-write one, before and after verify: damage is local.
//   - Read-only, nothing is written. Read-write, deletes and stores after the open succeed (where no block
//     refuses writes) and load back; after a restart a key deleted is a miss, and the keys stored are there where
//     nothing failed and no more damage came; and no key served then was not served the same before it (no key
//     lost at the first open comes back at the second) where no block refused a write. A key stored again may
//     show an older copy after the restart only where its new copy may be lost (more damage, a read error that
//     stays) and the older copy may have outlived it unmarked (its tombstone refused, or the copy unseen when
//     the store was made): docs/card_format.md, Recovery, "What damage can do, and what it cannot".
//
// card_fuzz_test [seeds=FIRST:COUNT] [verbose]: seeds FIRST to FIRST + COUNT - 1 (default 0:40); verbose prints
// each seed's damage. A failed check names its seed and the damage; `seeds=S:1 verbose` repeats it alone.
// Built and run by tests/store/test_card_fuzz.py (ADP_CARD_FUZZ_SEEDS for a longer range by hand), and under ASan
// by tests/sanitizers/test_sanitizers.py.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_format.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::CardStore;
using adp::IoContext;
using adp::kBlockSize;
using adp::Status;
using adp::testing::check;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;
namespace small_card = adp::testing::small_card;

using Bytes = std::vector<uint8_t>;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(small_card::kRegions, small_card::kRegion);
constexpr uint64_t kBlocks = kCardBytes / kBlockSize;
constexpr int kWorkloads = 6;
constexpr unsigned kSeedAlarmSeconds = 120;  // a seed takes well under a second: past this it hangs

volatile sig_atomic_t current_seed = -1;

void on_alarm(int) {
  char msg[96];
  int n = std::snprintf(msg, sizeof msg, "card_fuzz_test: seed %d hung (no progress in %u s)\n",
                        static_cast<int>(current_seed), kSeedAlarmSeconds);
  if (n > 0) (void)!write(2, msg, static_cast<size_t>(n));
  _exit(3);
}

Bytes value_of(uint32_t id, size_t n) {
  Bytes v(n);
  uint64_t x = id * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

// A record of the undamaged image, as a walk of its region finds it.
struct Record {
  uint32_t region = 0;
  uint64_t offset = 0;  // in the region
  uint64_t seq = 0, payload_bytes = 0;
  std::string key;
  bool deleted = false, pad = false;
  bool complete = true;           // every region it continues into found
  std::vector<uint32_t> regions;  // its header's, then those it continues into (in order)
};

// One workload's card and what it holds.
struct Workload {
  std::vector<uint8_t> image;
  std::vector<std::string> keys;
  std::vector<Bytes> values;                       // by store id
  std::map<std::string, std::vector<int>> stores;  // key -> its store ids, in order
  std::map<std::string, int> served;               // key -> the store id the undamaged card serves (absent: a miss)
  // Object header blocks as their stores wrote them (before any tombstone over them): image offset -> (bytes of
  // the block, store id, seq).
  struct Old {
    uint64_t at;
    Bytes block;
    int id;
    uint64_t seq;
  };
  std::vector<Old> old_headers;
  std::vector<Record> records;           // the walk of the final image
  std::map<uint64_t, size_t> header_at;  // image offset of a record's header block -> records index
  uint64_t card_id = 0;
  uint64_t evicted = 0;
};

uint64_t region_base(uint32_t r) { return adp::kDataOffset + uint64_t(r) * small_card::kRegion; }

// Walks the undamaged image as recovery does (no damage in it): the records of each region, and the regions a
// record continuing past its region's end goes on in (the region whose header names its region and epoch).
void walk(Workload& w) {
  const uint8_t* img = w.image.data();
  adp::Superblock sb;
  std::memcpy(&sb, img, sizeof sb);
  w.card_id = sb.card_id;
  std::vector<adp::RegionHeader> rh(small_card::kRegions);
  std::vector<bool> valid(small_card::kRegions);
  for (uint32_t r = 0; r < small_card::kRegions; r++)
    valid[r] = adp::decode_region_header(img + region_base(r), w.card_id, r, &rh[r]);
  auto next_of = [&](uint32_t p) {
    int64_t best = -1;
    for (uint32_t r = 0; r < small_card::kRegions; r++)
      if (valid[r] && rh[r].prev_region == p && rh[r].prev_epoch == rh[p].epoch &&
          (best < 0 || rh[r].epoch > rh[best].epoch))
        best = r;
    return best;
  };
  for (uint32_t r = 0; r < small_card::kRegions; r++) {
    if (!valid[r]) continue;
    for (uint64_t off = kBlockSize + rh[r].cont_bytes; off + kBlockSize <= small_card::kRegion;) {
      adp::ObjectHeader h;
      const uint8_t* b = img + region_base(r) + off;
      if (!adp::decode_object_header(b, w.card_id, rh[r].epoch, &h)) break;
      Record rec;
      rec.region = r;
      rec.offset = off;
      rec.seq = h.seq;
      rec.payload_bytes = h.payload_bytes;
      rec.key = std::string(adp::object_key(b, h));
      rec.deleted = h.flags & adp::kObjectDeleted;
      rec.pad = h.flags & adp::kObjectPad;
      rec.regions.push_back(r);
      uint64_t end = off + adp::object_footprint(h.payload_bytes);
      for (uint32_t cur = r; end > small_card::kRegion;) {
        int64_t nx = next_of(cur);
        if (nx < 0) {
          rec.complete = false;
          break;
        }
        rec.regions.push_back(static_cast<uint32_t>(nx));
        end -= small_card::kRegion - kBlockSize;
        cur = static_cast<uint32_t>(nx);
      }
      w.header_at[region_base(r) + off] = w.records.size();
      w.records.push_back(rec);
      off = off + adp::object_footprint(h.payload_bytes);
      if (off > small_card::kRegion) break;
    }
  }
}

// The live object headers of `key` on the image, by seq: those a store just wrote are the ones not seen before.
void note_new_headers(Workload& w, const FaultImage& image, const std::string& key, int id,
                      std::set<uint64_t>* seen_seqs) {
  adp::Superblock sb;
  std::memcpy(&sb, image.data.data(), sizeof sb);
  for (uint64_t at = adp::kDataOffset; at + kBlockSize <= image.data.size(); at += kBlockSize) {
    const uint8_t* b = image.data.data() + at;
    if (std::memcmp(b, adp::kObjectMagic, 8) != 0) continue;
    adp::ObjectHeader h;
    std::memcpy(&h, b, sizeof h);
    if (h.card_id != sb.card_id || (h.flags & (adp::kObjectDeleted | adp::kObjectPad))) continue;
    if (adp::object_key(b, h) != key || seen_seqs->count(h.seq)) continue;
    seen_seqs->insert(h.seq);
    w.old_headers.push_back({at, Bytes(b, b + kBlockSize), id, h.seq});
  }
}

// Workload `n`: one writer storing, storing again and deleting 14 keys on a new card until it evicted twice or more
// (the odd ones then go on with small objects of five keys).
Workload make_workload(int n) {
  Workload w;
  auto image = std::make_shared<FaultImage>(kCardBytes);
  FaultDevice* dev = nullptr;
  auto s = adp::testing::checked_fault_card(image, small_card::kCard, "workload open", &dev);
  if (!s) return w;
  IoContext ctx;
  std::mt19937_64 rng(1000 + n);
  const size_t sizes[] = {3000, 60000, 200000, 204800, 700000, 1500000};
  for (int k = 0; k < 14; k++) w.keys.push_back("fuzz@" + std::to_string(n) + "@" + std::to_string(k));
  std::set<uint64_t> seen_seqs;
  auto one_op = [&](const std::string& key, size_t size, bool remove) {
    if (remove) {
      Status r = s->remove(ctx, key);
      check(r.ok() || r.code() == Status::Code::kNotFound, "workload delete: " + r.message());
      return;
    }
    const int id = static_cast<int>(w.values.size());
    w.values.push_back(value_of(static_cast<uint32_t>(n * 100000 + id), size));
    Status r = adp::testing::put_one(*s, ctx, key, w.values.back());
    check(r.ok(), "workload store: " + r.message());
    w.stores[key].push_back(id);
    note_new_headers(w, *image, key, id, &seen_seqs);
  };
  for (int op = 0; op < 200 && (s->stats().evicted_regions < 2 || op < 40); op++)
    one_op(w.keys[rng() % w.keys.size()], sizes[rng() % std::size(sizes)], rng() % 5 == 0);
  // The odd workloads end with small objects of five keys, stored again and deleted over and over after the last
  // eviction: their older copies' tombstones stay on the card beside the newer records that outrank them.
  if (n % 2)
    for (int op = 0; op < 30; op++) one_op(w.keys[rng() % 5], sizes[rng() % 2], rng() % 3 == 0);
  w.evicted = s->stats().evicted_regions;
  check(w.evicted >= 1, "workload " + std::to_string(n) + " evicted a region");
  for (const std::string& key : w.keys) {
    auto got = adp::testing::read_object(*s, ctx, key);
    if (!got) continue;
    const auto& ids = w.stores[key];
    check(!ids.empty() && *got == w.values[ids.back()],
          "workload " + std::to_string(n) + ": " + key + " serves its last store's bytes");
    if (!ids.empty()) w.served[key] = ids.back();
  }
  s.reset();
  w.image = image->data;
  walk(w);
  return w;
}

// What a seed did to its copy of the image.
struct Damage {
  std::set<uint64_t> changed;     // blocks whose bytes were changed (flipped, zeroed, garbage, put back)
  std::set<uint64_t> cut_like;    // of them, those a walk reads as a crash's cut (older bytes)
  std::set<uint64_t> unreadable;  // blocks whose reads fail
  std::set<uint64_t> unwritable;  // blocks whose writes fail
  std::vector<int> put_back;      // store ids whose header blocks were put back (a lost tombstone write)
  uint64_t size = kCardBytes;     // the image's size (its tail cut off where less)
  std::string text;               // what was done, for a failed check's report

  bool touched(uint64_t block) const { return changed.count(block) || unreadable.count(block); }
  // Both copies of the superblock damaged (block 0 and the backup, session 39), or the image cut short: the one
  // damage that may cost the card (its open refused); a record behind it is not required.
  bool superblock_lost() const {
    return (touched(0) && touched(adp::kBackupSuperblockOffset / kBlockSize)) || size < kCardBytes;
  }
};

// Damages image (a copy of w's) as seed draws; returns what it did.
Damage damage(const Workload& w, FaultImage& image, std::mt19937_64& rng) {
  Damage d;
  auto add = [&](const std::string& s) { d.text += (d.text.empty() ? "" : "; ") + s; };
  std::vector<uint64_t> live_headers, tombstones, payload;
  for (const Record& r : w.records) {
    uint64_t at = region_base(r.region) + r.offset;
    (r.deleted ? tombstones : live_headers).push_back(at / kBlockSize);
    if (!r.deleted && !r.pad && r.payload_bytes && r.regions.size() == 1)
      payload.push_back(at / kBlockSize + 1 + rng() % adp::round_up_block(r.payload_bytes) / kBlockSize);
  }
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; i++) {
    // The target block.
    uint64_t block;
    const unsigned aim = rng() % 100;
    std::string what;
    if (aim < 3) {
      block = 0, what = "superblock";
    } else if (aim < 5) {
      block = adp::kBackupSuperblockOffset / kBlockSize, what = "backup superblock";
    } else if (aim < 25) {
      uint32_t r = rng() % small_card::kRegions;
      block = region_base(r) / kBlockSize, what = "region " + std::to_string(r) + " header";
    } else if (aim < 55 && !live_headers.empty()) {
      block = live_headers[rng() % live_headers.size()], what = "object header";
    } else if (aim < 70 && !tombstones.empty()) {
      block = tombstones[rng() % tombstones.size()], what = "tombstone";
    } else if (aim < 85 && !payload.empty()) {
      block = payload[rng() % payload.size()], what = "payload";
    } else {
      block = rng() % kBlocks, what = "block";
    }
    what += " " + std::to_string(block);
    uint8_t* b = image.data.data() + block * kBlockSize;
    const unsigned kind = rng() % 100;
    if (kind < 35) {
      // Bytes flipped: mostly in a header's first 96 bytes (its fields and key), else anywhere in the block.
      const int flips = 1 + static_cast<int>(rng() % 8);
      bool cut = false;
      std::string at;
      for (int f = 0; f < flips; f++) {
        const size_t pos = rng() % 2 ? rng() % 96 : rng() % kBlockSize;
        b[pos] ^= static_cast<uint8_t>(1 + rng() % 255);
        cut |= pos < 24;  // an object header's magic, card_id or epoch: read as older bytes, a cut
        at += (f ? "," : "") + std::to_string(pos);
      }
      d.changed.insert(block);
      if (cut) d.cut_like.insert(block);
      add(what + ": bytes " + at + " flipped");
    } else if (kind < 50) {
      std::memset(b, 0, kBlockSize);
      d.changed.insert(block), d.cut_like.insert(block);
      add(what + ": zeroed");
    } else if (kind < 60) {
      for (uint64_t k = 0; k < kBlockSize; k++) b[k] = static_cast<uint8_t>(rng());
      d.changed.insert(block), d.cut_like.insert(block);
      add(what + ": random bytes");
    } else if (kind < 72) {
      const uint64_t count = 1 + rng() % 3;
      for (uint64_t k = 0; k < count && block + k < kBlocks; k++) d.unreadable.insert(block + k);
      if (rng() % 2) d.unwritable.insert(block);
      add(what + ": " + std::to_string(count) + " blocks unreadable" +
          (d.unwritable.count(block) ? ", the first unwritable too" : ""));
    } else if (kind < 78) {
      d.unwritable.insert(block);
      add(what + ": unwritable");
    } else if (kind < 96 && !w.old_headers.empty()) {
      // A lost write: an object header block as its store wrote it, put back; mostly one whose tombstone (the
      // same record: its seq) is still there, so that what comes back is a whole record of the region's epoch.
      std::vector<const Workload::Old*> under_tombstone;
      for (const Workload::Old& o : w.old_headers)
        if (auto it = w.header_at.find(o.at);
            it != w.header_at.end() && w.records[it->second].deleted && w.records[it->second].seq == o.seq)
          under_tombstone.push_back(&o);
      const Workload::Old& o = !under_tombstone.empty() && rng() % 5 ? *under_tombstone[rng() % under_tombstone.size()]
                                                                     : w.old_headers[rng() % w.old_headers.size()];
      std::memcpy(image.data.data() + o.at, o.block.data(), kBlockSize);
      d.changed.insert(o.at / kBlockSize), d.cut_like.insert(o.at / kBlockSize);
      d.put_back.push_back(o.id);
      add("block " + std::to_string(o.at / kBlockSize) + ": put back as store " + std::to_string(o.id) +
          " wrote it (seq " + std::to_string(o.seq) + ")");
    } else {
      const uint64_t size = adp::kDataOffset / 2 + rng() % (kCardBytes - adp::kDataOffset / 2);
      const uint64_t cut = rng() % 2 ? size / kBlockSize * kBlockSize : size;
      if (cut < d.size) d.size = cut;
      add("tail cut off at " + std::to_string(cut));
    }
  }
  if (d.size < image.data.size()) image.data.resize(d.size);
  return d;
}

// Whether recovery must find record i of the undamaged image on the damaged one: its blocks, the headers of the
// regions it lies in and the superblock intact, and no cut-like damage in front of it in its region (object header
// blocks only: the walk steps over payload).
bool intact(const Workload& w, const Damage& d, size_t i) {
  const Record& rec = w.records[i];
  if (d.superblock_lost()) return false;
  if (!rec.complete) return false;  // continues into a region the walk did not find
  for (uint32_t r : rec.regions)
    if (d.touched(region_base(r) / kBlockSize)) return false;
  for (size_t j = 0; j < w.records.size(); j++) {
    const Record& o = w.records[j];
    if (o.region != rec.region || o.offset >= rec.offset) continue;
    if (d.cut_like.count((region_base(o.region) + o.offset) / kBlockSize)) return false;
  }
  // Its footprint, region by region (each one it continues into after its header block).
  uint64_t left = adp::object_footprint(rec.payload_bytes), at = region_base(rec.region) + rec.offset;
  for (size_t k = 0; left; k++) {
    if (k == rec.regions.size()) return false;
    const uint64_t room = region_base(rec.regions[k]) + small_card::kRegion - at, take = std::min(room, left);
    for (uint64_t b = at; b < at + take; b += kBlockSize)
      if (d.touched(b / kBlockSize)) return false;
    left -= take;
    if (left && k + 1 < rec.regions.size()) at = region_base(rec.regions[k + 1]) + kBlockSize;
  }
  return true;
}

// For each key, the bytes a load may return (besides a miss) and whether it must return them (`required`).
struct Expect {
  std::vector<int> allowed;  // store ids
  int served = -1;           // the one the undamaged card serves
  std::optional<int> required;
};

std::map<std::string, Expect> expectations(const Workload& w, const Damage& d) {
  std::map<std::string, Expect> out;
  for (const std::string& key : w.keys) {
    Expect e;
    if (auto it = w.served.find(key); it != w.served.end()) {
      e.allowed.push_back(it->second);
      e.served = it->second;
      // The record it is served from: the live one of its key (one at most on the undamaged card).
      for (size_t i = 0; i < w.records.size(); i++)
        if (w.records[i].key == key && !w.records[i].deleted && !w.records[i].pad && intact(w, d, i))
          e.required = it->second;
    }
    out[key] = e;
  }
  // A copy whose header was put back: servable only while no newer record of its key is intact.
  for (const int id : d.put_back) {
    std::string key;
    uint64_t seq = 0;
    for (const auto& o : w.old_headers)
      if (o.id == id) seq = o.seq;
    for (const auto& [k, ids] : w.stores)
      if (std::find(ids.begin(), ids.end(), id) != ids.end()) key = k;
    bool outranked = false;
    for (size_t i = 0; i < w.records.size(); i++)
      if (w.records[i].key == key && w.records[i].seq > seq && intact(w, d, i)) outranked = true;
    if (!outranked) out[key].allowed.push_back(id);
  }
  return out;
}

// Which store of key `bytes` are, in words (a failed check's report).
std::string which(const Workload& w, const std::string& key, const Bytes& bytes) {
  if (auto it = w.stores.find(key); it != w.stores.end())
    for (int id : it->second)
      if (w.values[id] == bytes) return "store " + std::to_string(id) + " of its " + std::to_string(it->second.size());
  return "none of its stores";
}

// More damage on a card already opened (destroying only: flips over a header's fields, zeros, garbage), over an
// object or region header of this card or any block of its regions; what it did, in words.
std::string damage_more(FaultImage& image, std::mt19937_64& rng) {
  adp::Superblock sb;
  std::memcpy(&sb, image.data.data(), sizeof sb);
  std::vector<uint64_t> headers;
  const uint64_t first = adp::kDataOffset / kBlockSize, blocks = image.data.size() / kBlockSize;
  for (uint64_t b = first; b < blocks; b++) {
    const uint8_t* p = image.data.data() + b * kBlockSize;
    uint64_t id;
    std::memcpy(&id, p + 8, 8);
    if ((!std::memcmp(p, adp::kObjectMagic, 8) || !std::memcmp(p, adp::kRegionMagic, 8)) && id == sb.card_id)
      headers.push_back(b);
  }
  std::string text;
  const int n = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < n && !headers.empty() && blocks > first; i++) {
    const uint64_t b = rng() % 2 ? headers[rng() % headers.size()] : first + rng() % (blocks - first);
    uint8_t* p = image.data.data() + b * kBlockSize;
    switch (rng() % 3) {
      case 0:
        for (int f = 0; f < 4; f++) p[rng() % 96] ^= static_cast<uint8_t>(1 + rng() % 255);
        text += " block " + std::to_string(b) + " flipped;";
        break;
      case 1:
        std::memset(p, 0, kBlockSize);
        text += " block " + std::to_string(b) + " zeroed;";
        break;
      default:
        for (uint64_t k = 0; k < kBlockSize; k++) p[k] = static_cast<uint8_t>(rng());
        text += " block " + std::to_string(b) + " garbage;";
    }
  }
  return text;
}

struct Totals {
  uint64_t seeds = 0, refused = 0, hits = 0, misses = 0, required = 0, put_back_served = 0, verify_bad = 0;
  uint64_t foreign_refused = 0;  // read-write opens refused for a foreign block 0, then opened by restore_block_zero
};

// Whether block 0 as an open reads it now holds readable bytes that are not a superblock of ours (not blank, not
// torn: the magic, or a part of it and zeros after it) while the backup superblock is valid (fd39): damage or
// another program's data, which no open tells apart. Every open refuses such a card, writing nothing; only
// CardOptions::restore_block_zero (`verify --repair`) opens it, rewriting block 0 from the backup.
bool foreign_block_zero(const FaultImage& image, const Damage& d) {
  const uint64_t backup_at = adp::kBackupSuperblockOffset;
  if (image.data.size() < adp::kDataOffset || d.unreadable.count(0) || d.unreadable.count(backup_at / kBlockSize))
    return false;
  const uint8_t* b = image.data.data();
  adp::Superblock sb, backup;
  std::memcpy(&sb, b, sizeof sb);
  std::memcpy(&backup, b + backup_at, sizeof backup);
  if (adp::valid_superblock(sb) || !adp::valid_superblock(backup)) return false;
  auto zeros = [&](size_t from) { return std::all_of(b + from, b + kBlockSize, [](uint8_t c) { return c == 0; }); };
  size_t n = 0;
  while (n < sizeof adp::kSuperMagic && b[n] == static_cast<uint8_t>(adp::kSuperMagic[n])) n++;
  const bool torn = n == sizeof adp::kSuperMagic || (n > 0 && zeros(n));
  return !zeros(0) && !torn;
}

std::string describe(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return "{" + s + "}";
}

// Loads every key of w; checks each against `expect`; the store id each one served (-1: a miss, NotFound; -2: a
// load that failed otherwise, an I/O error).
std::map<std::string, int> load_all(CardStore& s, const Workload& w, const std::map<std::string, Expect>& expect,
                                    const std::string& where, Totals* t, bool require = true,
                                    const std::map<std::string, int>* skip = nullptr) {
  std::map<std::string, int> got_ids;
  IoContext ctx;
  for (const std::string& key : w.keys) {
    if (skip && skip->count(key)) continue;
    const Expect& e = expect.at(key);
    Status st;
    auto got = adp::testing::read_object(s, ctx, key, &st);
    int id = -1;
    if (got) {
      for (int a : e.allowed)
        if (*got == w.values[a]) id = a;
      check(id >= 0, where + ": " + key + " served " + std::to_string(got->size()) +
                         " bytes that are none of its allowed copies " + describe(e.allowed));
      if (id >= 0 && id != e.served) t->put_back_served++;
      t->hits++;
    } else {
      t->misses++;
      id = st.is_not_found() ? -1 : -2;
    }
    if (require && e.required) {
      t->required++;
      check(id == *e.required, where + ": " + key + " (intact on the card) not served: " +
                                   (got ? "other bytes" : "'" + st.message() + "'"));
    }
    got_ids[key] = id;
  }
  return got_ids;
}

void run_seed(const Workload& w, int seed, bool verbose, Totals* t) {
  std::mt19937_64 rng(0x5eed0000ull + static_cast<uint64_t>(seed));
  auto image = std::make_shared<FaultImage>(0);
  image->data = w.image;
  Damage d = damage(w, *image, rng);
  std::string where = "seed " + std::to_string(seed) + " [" + d.text + "]";
  if (verbose) std::printf("%s\n", where.c_str());
  const auto expect = expectations(w, d);
  const bool write_faults = !d.unwritable.empty();
  const bool any_faults = write_faults || !d.unreadable.empty();
  auto device = [&](const std::string& name) {
    auto dev = std::make_unique<FaultDevice>(image, name);
    for (uint64_t b : d.unreadable) dev->fail_reads(b * kBlockSize, (b + 1) * kBlockSize);
    for (uint64_t b : d.unwritable) dev->fail_writes(b * kBlockSize, (b + 1) * kBlockSize);
    return dev;
  };
  // An open of the card as it is now, refused only with a reason and only where both copies of the superblock
  // (block 0 and its backup, session 39: one of them damaged costs nothing) or the size were damaged.
  const bool may_refuse = d.superblock_lost();
  auto open = [&](bool read_only, FaultDevice** dev_out, std::unique_ptr<CardStore>* s) {
    auto dev = device(read_only ? "fuzz-ro" : "fuzz-rw");
    *dev_out = dev.get();
    adp::CardOptions co = small_card::kCard;
    co.read_only = read_only;
    co.format_blank = !read_only;
    co.recovery_threads = 1 + seed % 4;
    const bool foreign = foreign_block_zero(*image, d);
    const std::vector<uint8_t> before = foreign ? image->data : std::vector<uint8_t>();
    Status st = CardStore::OpenDevice(std::move(dev), co, s);
    const std::string which = read_only ? "the read-only open" : "the open";
    check(st.ok() || !st.message().empty(), where + ": " + which + " refused without saying why");
    check(st.ok() || may_refuse || foreign,
          where + ": " + which + " refused a card whose superblock is intact: '" + st.message() + "'");
    if (foreign) {
      // Block 0 holds other bytes beside a valid backup: refused, nothing written (fd39), then opened read-write
      // with restore_block_zero, as `verify --repair` does, which rewrites block 0 from the backup.
      check(!st.ok() && st.message().find("block 0 is not an ADP superblock") != std::string::npos &&
                st.message().find("--repair") != std::string::npos,
            where + ": " + which + " of a card whose block 0 holds other bytes beside a valid backup: " +
                (st.ok() ? "opened" : "'" + st.message() + "'") + ", not refused naming verify --repair");
      check(image->data == before, where + ": " + which + " of a card whose block 0 holds other bytes wrote to it");
      if (read_only || st.ok()) return st;
      t->foreign_refused++;
      auto again = device("fuzz-repair");
      *dev_out = again.get();
      co.restore_block_zero = true;
      st = CardStore::OpenDevice(std::move(again), co, s);
      check(st.ok() || may_refuse,
            where + ": the open with restore_block_zero (verify --repair) refused: '" + st.message() + "'");
    }
    return st;
  };
  t->seeds++;

  // Read-only, as status and verify open a card: nothing written.
  {
    FaultDevice* dev = nullptr;
    std::unique_ptr<CardStore> s;
    if (open(true, &dev, &s).ok()) {
      IoContext ctx;
      adp::VerifyReport report;
      Status v = s->verify(ctx, false, [](uint64_t, uint64_t) {}, &report);
      check(v.ok(), where + ": read-only verify runs: '" + v.message() + "'");
      load_all(*s, w, expect, where + " (read-only)", t);
      check(dev->writes() == 0, where + ": the read-only open wrote " + std::to_string(dev->writes()) + " times");
    }
  }

  // Read-write: verify, every key loaded, stores, and a restart.
  std::map<std::string, int> first;
  std::vector<std::pair<std::string, Bytes>> fresh;  // stored after the open: old keys stored again, new keys
  std::map<std::string, int> touched;                // old keys deleted or stored again after the open
  std::set<std::string> deleted;                     // old keys whose delete after the open succeeded
  // More damage after the first read-write open (a third of the seeds): while it is open, before the deletes and
  // stores made through it, or after them, before the restart.
  const unsigned more = rng() % 6;
  const bool more_damage = more < 2, damage_live = more == 0;
  {
    FaultDevice* dev = nullptr;
    std::unique_ptr<CardStore> s;
    if (!open(false, &dev, &s).ok()) {
      t->refused++;
      return;
    }
    IoContext ctx;
    adp::VerifyReport report;
    const bool repair = seed % 4 == 0;
    Status v = s->verify(ctx, repair, [](uint64_t, uint64_t) {}, &report);
    check(v.ok(), where + ": verify runs: '" + v.message() + "'");
    t->verify_bad += report.bad;
    if (repair && v.ok()) {
      // What --repair dropped is gone: a second verify finds bad only the objects it left, those whose read failed
      // (an error that may pass: not dropped).
      adp::VerifyReport again;
      v = s->verify(ctx, false, [](uint64_t, uint64_t) {}, &again);
      check(v.ok() && again.bad == report.bad - report.repaired,
            where + ": verify after --repair: '" + v.message() + "', " + std::to_string(again.bad) + " bad (" +
                (again.bad_objects.empty() ? "" : again.bad_objects[0]) + "), " + std::to_string(report.bad) +
                " before it, " + std::to_string(report.repaired) + " repaired");
    }
    first = load_all(*s, w, expect, where + " (after verify" + (repair ? " --repair)" : ")"), t);
    if (damage_live) {
      where += " then, open:" + damage_more(*image, rng);
      load_all(*s, w, expect, where, t, false);
    }
    // Two old keys deleted, two stored again (a delete acknowledged stays deleted, a store acknowledged outranks
    // every older copy, after the restart), three new ones stored.
    for (int i = 0; i < 2; i++) {
      const std::string& key = w.keys[rng() % w.keys.size()];
      if (touched.count(key)) continue;
      touched[key] = -1;
      Status r = s->remove(ctx, key);
      check(r.ok() || r.is_not_found() || write_faults,
            where + ": a delete after the open fails on a card with no block refusing writes: '" + r.message() + "'");
      if (r.ok()) deleted.insert(key);
    }
    for (int i = 0; i < 2; i++) {
      const std::string& key = w.keys[rng() % w.keys.size()];
      if (touched.count(key)) continue;
      touched[key] = -1;
      fresh.emplace_back(key, value_of(static_cast<uint32_t>(800000 + i), 100000 + 4096 * i));
    }
    for (int i = 0; i < 3; i++) {
      const size_t sizes[] = {5000, 150000, 600000};
      fresh.emplace_back("fuzz@new@" + std::to_string(i), value_of(static_cast<uint32_t>(900000 + i), sizes[i]));
    }
    for (size_t i = 0; i < fresh.size();) {
      const auto& [key, bytes] = fresh[i];
      Status r = adp::testing::put_one(*s, ctx, key, bytes);
      check(r.ok() || write_faults,
            where + ": a store after the open fails on a card with no block refusing writes: '" + r.message() + "'");
      if (!r.ok()) {
        fresh.erase(fresh.begin() + static_cast<ptrdiff_t>(i));
        continue;
      }
      Status lst;
      auto got = adp::testing::read_object(*s, ctx, key, &lst);
      check(got ? *got == bytes : any_faults, where + ": " + key + " stored after the open: " +
                                                  (got ? "other bytes served" : "not served: '" + lst.message() + "'"));
      i++;
    }
    for (const std::string& key : deleted) {
      auto got = adp::testing::read_object(*s, ctx, key);
      check(!got, where + ": " + key + " deleted after the open is served");
    }
  }
  // Before the restart: the read errors may pass (transient), and more damage may come (destroying only: zeros,
  // flips and garbage over any header or payload block, this open's writes included).
  const bool errors_pass = rng() % 2;
  if (errors_pass) d.unreadable.clear();
  if (more_damage && !damage_live) where += " then, closed:" + damage_more(*image, rng);
  if (errors_pass) where += " then the read errors passed";
  if (verbose) std::printf("%s\n", where.c_str());
  // The restart: old keys as allowed, and served only as the first open served them (or failed to read them)
  // where no write failed and no more damage came; the keys deleted a miss; those stored again and the new ones
  // all there where nothing failed.
  {
    FaultDevice* dev = nullptr;
    std::unique_ptr<CardStore> s;
    Status st = open(false, &dev, &s);
    check(st.ok(), where + ": the reopen after the stores succeeds: '" + st.message() + "'");
    if (!st.ok()) return;
    auto again = load_all(*s, w, expect, where + " (reopened)", t, false, &touched);
    if (!write_faults && !more_damage)
      for (const auto& [key, id] : again)
        check(id < 0 || id == first[key] || first[key] == -2, where + ": " + key + " served store " +
                                                                  std::to_string(id) + " after the restart, " +
                                                                  std::to_string(first[key]) + " before it");
    IoContext ctx;
    for (const std::string& key : deleted) {
      auto got = adp::testing::read_object(*s, ctx, key);
      check(!got, where + ": " + key + ", deleted after the first open, is served after the restart");
    }
    // A key stored again may be served as its older copies were allowed only where both the new copy may be lost
    // (more damage over it, or a read error that stays: a region header or the copy's own header there) and an
    // older copy may have outlived it unmarked: its tombstone refused (a block refusing writes: pending, lost at
    // the close), or the older copy unseen at the first open (its header could not be read; the error passed and
    // the pad over it was refused), so the new store did not mark it. Nothing on the card outranks it then.
    const bool clean = !any_faults && !more_damage;
    const bool new_copy_lost = more_damage || !d.unreadable.empty();
    const bool older_unmarked = more_damage || write_faults;
    for (const auto& [key, bytes] : fresh) {
      Status lst;
      auto got = adp::testing::read_object(*s, ctx, key, &lst);
      int older = -1;
      if (got && *got != bytes && new_copy_lost && older_unmarked && expect.count(key))
        for (int a : expect.at(key).allowed)
          if (*got == w.values[a]) older = a;
      check(got ? *got == bytes || older >= 0 : !clean,
            where + ": " + key + " stored before the restart: " +
                (got ? "other bytes served (" + which(w, key, *got) + ")" : "not served: '" + lst.message() + "'"));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int first = 0, count = 40;
  bool verbose = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a.rfind("seeds=", 0) == 0 && std::sscanf(a.c_str() + 6, "%d:%d", &first, &count) == 2) continue;
    if (a == "verbose") {
      verbose = true;
      continue;
    }
    std::fprintf(stderr, "usage: %s [seeds=FIRST:COUNT] [verbose]\n", argv[0]);
    return 2;
  }
  signal(SIGALRM, on_alarm);
  std::vector<Workload> workloads;
  for (int n = 0; n < kWorkloads; n++) workloads.push_back(make_workload(n));
  for (const Workload& w : workloads)
    if (w.image.empty() || w.records.empty()) return adp::testing::finish("card_fuzz_test");
  Totals t;
  for (int seed = first; seed < first + count; seed++) {
    current_seed = seed;
    alarm(kSeedAlarmSeconds);
    try {
      run_seed(workloads[seed % kWorkloads], seed, verbose, &t);
    } catch (const std::exception& e) {
      check(false, "seed " + std::to_string(seed) + ": an exception left the store: " + e.what());
    }
    alarm(0);
  }
  std::printf(
      "card_fuzz_test: seeds %d to %d: %llu opens refused, %llu loads served, %llu missed, %llu of them required "
      "(intact), %llu served a copy whose header was put back, verify found %llu bad; %llu opens refused for other "
      "bytes in block 0 beside a valid backup, then opened with verify --repair's option\n",
      first, first + count - 1, (unsigned long long)t.refused, (unsigned long long)t.hits, (unsigned long long)t.misses,
      (unsigned long long)t.required, (unsigned long long)t.put_back_served, (unsigned long long)t.verify_bad,
      (unsigned long long)t.foreign_refused);
  return adp::testing::finish("card_fuzz_test");
}
