// SPDX-License-Identifier: Apache-2.0
// A region whose header recovery's walk could not take (unreadable, or reading
// back wrong) at a read-write open: its records were not walked, so their seqs
// and its epoch did not count toward the next ones (docs/card_format.md,
// Recovery, "A region header not walked"). On a fault device, built and run by
// tests/store/test_recovery_damage.py.
//   - The header unreadable at an open (a transient error), readable again at
//     the next: a key stored again after the open and one stored and deleted
//     after it keep what was done after the open, a key deleted while it was
//     unseen stays deleted (the header is zeroed at the open: the region's
//     records stay lost, as the walk could not see them).
//   - The same with the header's block unwritable too (the zeroing fails): the
//     object headers behind it are zeroed instead, and the next seq set past
//     the highest found there, so the stores after the open still outrank its
//     records and g stays deleted; three such opens in a row take no margin
//     each (until session 24: 2^32 each, the 46 bits spent); where a block
//     behind cannot be read, the margin is taken.
//   - The frontier's region header reading back wrong (its checksum fails): the
//     region is free, and the lowest, so it is the first handed out; under its
//     old epoch, a record of the region's last opening right behind the first
//     new one would be walked again (a key deleted after the open back).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::IoContext;
using adp::testing::check;
using adp::testing::FaultImage;

constexpr uint64_t kRegion = 1u << 20;
constexpr uint64_t kRegion1 = adp::kDataOffset + kRegion;  // region 1's header block
constexpr size_t kSize = 16000;                            // footprint 20 KiB: 51 records fill a region's 1020 KiB
const adp::CardOptions kCard = adp::testing::card_options(kRegion);
using adp::testing::header_block;

std::vector<uint8_t> value(int i) {
  std::vector<uint8_t> v(kSize);
  for (size_t j = 0; j < kSize; j++) v[j] = static_cast<uint8_t>(i * 131 + j * 7);
  return v;
}

// A fault device whose reads (and, with unwritable, writes) of region 1's header block fail from its creation, and
// with bad_block set, the reads and writes of that block too.
struct BadHeaderDevice : adp::testing::FaultDevice {
  BadHeaderDevice(std::shared_ptr<FaultImage> image, std::string name) : FaultDevice(std::move(image), name) {
    fail_reads(kRegion1, kRegion1 + adp::kBlockSize);
    if (unwritable) fail_writes(kRegion1, kRegion1 + adp::kBlockSize);
    if (bad_block) {
      fail_reads(bad_block, bad_block + adp::kBlockSize);
      fail_writes(bad_block, bad_block + adp::kBlockSize);
    }
  }
  static inline bool unwritable = false;
  static inline uint64_t bad_block = 0;
};

// Rewrites the seq of key's record in the image (its header checksum recomputed).
void set_seq(FaultImage& image, const std::string& key, uint64_t seq) {
  uint8_t* b = image.data.data() + header_block(image, key);
  adp::ObjectHeader h;
  std::memcpy(&h, b, sizeof h);
  adp::encode_object_header(b, h.card_id, h.epoch, seq, key, h.payload_bytes, h.payload_crc, h.flags);
}

// Region 0: fill-0 .. fill-50 (seqs 1-51). Region 1 (the frontier): more-0 .. more-4, then k, d, g (seqs 52-59).
std::shared_ptr<FaultImage> two_regions() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  auto s = adp::testing::checked_fault_card(image, kCard, "open");
  IoContext ctx;
  std::vector<std::string> keys;
  for (int i = 0; i < 51; i++) keys.push_back("fill-" + std::to_string(i));
  for (int i = 0; i < 5; i++) keys.push_back("more-" + std::to_string(i));
  for (const char* k : {"k", "d", "g"}) keys.push_back(k);
  for (size_t i = 0; s && i < keys.size(); i++)
    check(adp::testing::put_one(*s, ctx, keys[i], value(int(i))).ok(), "store " + keys[i]);
  check(header_block(*image, "more-0") == kRegion1 + adp::kBlockSize, "more-0 is region 1's first record");
  return image;
}

void unreadable_header_at_an_open(bool unwritable) {
  auto image = two_regions();
  BadHeaderDevice::unwritable = unwritable;
  {
    auto s = adp::testing::checked_fault_card<BadHeaderDevice>(image, kCard, "open, region 1's header unreadable");
    if (!s) return;
    check(s->stats().objects == 51, "region 0's objects only: " + std::to_string(s->stats().objects));
    IoContext ctx;
    // Stored after the open: under the old code their seqs were 52, 53 (the walk saw 51), below k's and d's
    // copies in region 1 (57, 58).
    check(adp::testing::put_one(*s, ctx, "k", value(100)).ok(), "k stored again");
    check(adp::testing::put_one(*s, ctx, "d", value(101)).ok(), "d stored again");
    check(s->remove(ctx, "d").ok(), "then d deleted");
    check(s->remove(ctx, "g").is_not_found(), "g deleted: a miss, nothing written");
  }
  BadHeaderDevice::unwritable = false;
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen, the header readable again");
  if (!s) return;
  const std::string how = unwritable ? " (the header could not be zeroed)" : "";
  auto k = adp::testing::read_object(*s, "k");
  check(k == value(100), "k reads its copy stored after the open" + how +
                             (k == value(56) ? ": the older copy behind the header came back" : ""));
  check(!adp::testing::read_object(*s, "d"), "d, stored and deleted after the open, stays deleted" + how);
  // A key deleted while unseen (its delete wrote nothing) is hidden by the zeroed region header or, where that
  // could not be written, by the zeroed object headers behind it (until session 24 it came back there).
  check(!adp::testing::read_object(*s, "g"), "g, deleted while its region was unseen, stays deleted" + how);
  check(adp::testing::read_object(*s, "fill-7") == value(7), "region 0's objects read back");
}

void frontier_header_read_back_wrong() {
  auto image = two_regions();
  image->data[kRegion1 + 48] ^= 1;  // the reserved field: the checksum fails, the epoch field holds
  {
    auto s = adp::testing::checked_fault_card(image, kCard, "open, region 1's header damaged");
    if (!s) return;
    check(s->stats().recovery_damaged_regions == 1, "region 1's header is damage");
    IoContext ctx;
    // The first store after the open: region 1 (the lowest free) at 4 KiB, over more-0; more-1 right behind.
    check(adp::testing::put_one(*s, ctx, "new", value(200)).ok(), "new stored");
    check(header_block(*image, "new") == kRegion1 + adp::kBlockSize, "new is region 1's first record");
    check(s->remove(ctx, "more-1").is_not_found(), "more-1 deleted: a miss, nothing written");
  }
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  check(adp::testing::read_object(*s, "new") == value(200), "new reads back");
  auto got = adp::testing::read_object(*s, "more-1");
  check(!got, std::string("more-1, lost with its region's header and deleted, is back") +
                  (got == value(52) ? " (walked under the region's reused epoch)" : ""));
}

// Region 1's header unreadable and unwritable at three opens in a row, each storing one object: the object headers
// behind it are zeroed at the first, and the next seq follows the highest found. Until session 24 each open set it
// 2^32 past the highest seen (stores had outrun the earlier margin, so it was added again): with the card 3 * 2^32
// short of the 46 bits, the third open refused every store for good.
void no_margin_at_every_open() {
  auto image = two_regions();
  const uint64_t start = adp::kMaxIndexSeq - 3 * adp::kUnseenSeqMargin;
  set_seq(*image, "fill-0", start);  // the highest seq on the card
  BadHeaderDevice::unwritable = true;
  for (int i = 0; i < 3; i++) {
    auto s = adp::testing::checked_fault_card<BadHeaderDevice>(image, kCard, "open " + std::to_string(i));
    if (!s) break;
    const adp::StoreStats st = s->stats();
    check(st.recovery_seq_margin == 0, "open " + std::to_string(i) + " skipped " +
                                           std::to_string(st.recovery_seq_margin) + " seqs (the body was readable)");
    check(st.store_seqs_left == 3 * adp::kUnseenSeqMargin - i,
          "open " + std::to_string(i) + ": " + std::to_string(st.store_seqs_left) + " seqs left");
    IoContext ctx;
    const std::string key = "n-" + std::to_string(i);
    adp::Status put = adp::testing::put_one(*s, ctx, key, value(300 + i));
    check(put.ok(), "store " + key + " at open " + std::to_string(i) + ": " + put.message());
    if (i == 0) check(s->remove(ctx, "g").is_not_found(), "g deleted while its region was unseen");
  }
  BadHeaderDevice::unwritable = false;
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen, the header readable again");
  if (!s) return;
  check(s->stats().recovery_seq_margin == 0, "no margin once the header reads");
  for (int i = 0; i < 3; i++)
    check(adp::testing::read_object(*s, "n-" + std::to_string(i)) == value(300 + i), "n-" + std::to_string(i));
  check(!adp::testing::read_object(*s, "g"), "g stays deleted");
  check(adp::testing::read_object(*s, "fill-0") == value(0), "fill-0 reads back");
}

// Region 1's header unreadable and unwritable, and its first record's header block (more-0's) as well: what that
// block holds cannot be known, so the next seq is set past the margin, as before; a copy of more-0 stored after the
// open outranks the old one when both blocks read again (the old one walked again: the first record behind the
// header). Without the margin the new copy's seq equals the old one's (52) and the old one is found first.
void margin_where_a_block_behind_cannot_be_read() {
  auto image = two_regions();
  BadHeaderDevice::unwritable = true;
  BadHeaderDevice::bad_block = kRegion1 + adp::kBlockSize;
  {
    auto s = adp::testing::checked_fault_card<BadHeaderDevice>(image, kCard, "open, more-0's block unreadable too");
    if (s) {
      check(s->stats().recovery_seq_margin == adp::kUnseenSeqMargin,
            "the margin is taken: " + std::to_string(s->stats().recovery_seq_margin));
      IoContext ctx;
      check(adp::testing::put_one(*s, ctx, "more-0", value(400)).ok(), "more-0 stored again");
    }
  }
  BadHeaderDevice::unwritable = false;
  BadHeaderDevice::bad_block = 0;
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen, every block readable again");
  if (!s) return;
  check(adp::testing::read_object(*s, "more-0") == value(400), "more-0 reads its copy stored after the open");
  check(!adp::testing::read_object(*s, "more-1"), "more-1's header was zeroed: not walked again");
}

}  // namespace

int main() {
  unreadable_header_at_an_open(false);
  unreadable_header_at_an_open(true);
  no_margin_at_every_open();
  margin_where_a_block_behind_cannot_be_read();
  frontier_header_read_back_wrong();
  return adp::testing::finish("unseen_region_test");
}
