// SPDX-License-Identifier: Apache-2.0
// A re-store of a key whose new copy continues into the next region, while
// the older copy's tombstone is not on the card (its write failed: pending,
// retried at each store and delete), on a fault device. Until that tombstone
// is on the card every region the new copy has bytes in stays pinned: had the
// region it continues into been evicted, the new copy would be dropped (its
// continuation gone, in memory and at recovery) while the older copy, which it
// superseded and which was never marked deleted, stays whole on the card and
// comes back at the next open as the key's value: a superseded copy back after
// its key's newer store was acknowledged (found by tests/cpp/card_crash_mt_test.cc,
// `all`: seed=1 point=126, a cut keeping some unsynced writes, where the
// tombstone write was the cut one and another writer's store evicted the
// continuation region meanwhile). Built and run by tests/store/test_tombstone_race.py.
// The older copy's own region (where the newer copy starts) is no guard since session 35: evicting it drops the
// older copy too. So that the continuation region is the one eviction takes first, it ends with the newer copy
// (written to its last byte: no later store refreshes it) and a load of the pad refreshes the first region.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::testing::check;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;

constexpr uint64_t kRegion = 1u << 20;
constexpr size_t kK = 1024;
const std::vector<uint8_t> kOlder(100 * kK, 1), kNewer(1228 * kK, 2), kFiller(300 * kK, 3);

// A fault device that refuses every write of one block at `refused` (the older copy's tombstone; a store's
// record written there once its region is reused is larger).
struct RefusedBlock : FaultDevice {
  using FaultDevice::FaultDevice;
  uint64_t refused = UINT64_MAX;
  adp::Status writev(uint64_t offset, const iovec* iov, int count) const override {
    if (offset == refused && count == 1 && iov[0].iov_len == adp::kBlockSize)
      return adp::Status::IoError("refused tombstone block (test)");
    return FaultDevice::writev(offset, iov, count);
  }
};

// Stores the key's older copy, then (the frontier moved to 812 KiB of the region by a pad) its newer copy of
// 1232 KiB on the card, which continues into the next region to its end, with the older copy's tombstone failing
// (pending); then loads the pad (its region, the older copy's, refreshed). The older copy's header block.
uint64_t store_both(adp::CardStore& s, RefusedBlock& dev, const FaultImage& image) {
  adp::IoContext ctx;
  check(adp::testing::put_one(s, ctx, "key", kOlder).ok(), "the older copy is stored");
  check(adp::testing::put_one(s, ctx, "pad", std::vector<uint8_t>(700 * kK, 4)).ok(), "the pad is stored");
  const uint64_t h = adp::testing::header_block(image, "key");
  dev.refused = h;  // the older copy's tombstone cannot be written
  check(adp::testing::put_one(s, ctx, "key", kNewer).ok(), "the newer copy is stored (acknowledged)");
  check(adp::testing::read_object(s, ctx, "pad").has_value(), "the pad loads");
  return h;
}

// Stores until the first eviction, the pending tombstone retried (and failing) at each store. It takes the least
// recently used region not pinned: the newer copy's continuation region, were it not a guard (then the older copy
// stays on the card, unmarked, and comes back at the next open); the older copy's own region, which it is not
// (the older copy gone with it).
void fill(adp::CardStore& s) {
  adp::IoContext ctx;
  for (int i = 0; i < 40 && !s.stats().evicted_regions; i++)
    check(adp::testing::put_one(s, ctx, "filler-" + std::to_string(i), kFiller).ok(), "a filler is stored");
  check(s.stats().evicted_regions == 1, "the fillers evicted a region");
}

// The reopened card: the key serves the newer copy (held before: it must be), or nothing, never the older one.
void check_reopened(const std::shared_ptr<FaultImage>& image, bool held, const std::string& how) {
  auto s = adp::testing::checked_fault_card(image, adp::testing::card_options(kRegion), "reopen" + how);
  if (!s) return;
  auto got = adp::testing::read_object(*s, "key");
  check(!(got && *got == kOlder), "the superseded copy is back after the reopen" + how);
  check(!got || *got == kNewer, "the key serves the newer copy or nothing" + how);
  check(!held || got, "the key held before the reopen is lost" + how);
}

void superseded_copy_stays_dead(bool power_cut) {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  const adp::CardOptions co = adp::testing::card_options(kRegion);
  bool held = false;
  {
    RefusedBlock* dev;
    auto s = adp::testing::checked_fault_card<RefusedBlock>(image, co, "open", &dev);
    if (!s) return;
    store_both(*s, *dev, *image);
    fill(*s);
    held = s->exists("key");
    if (power_cut) dev->power_cut();
  }
  check_reopened(image, held, power_cut ? " (power cut)" : " (closed)");
}

// The same where the open finds the two copies (the older one's tombstone never written): recovery marks the
// older copy, that write fails (pending), and the regions of the newer copy it keeps must stay pinned.
uint64_t g_older_header = UINT64_MAX;
struct OlderHeaderUnwritable : RefusedBlock {
  OlderHeaderUnwritable(std::shared_ptr<FaultImage> image, std::string name) : RefusedBlock(std::move(image), name) {
    refused = g_older_header;
  }
};

void superseded_copy_found_at_the_open_stays_dead() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  const adp::CardOptions co = adp::testing::card_options(kRegion);
  {
    RefusedBlock* dev;
    auto s = adp::testing::checked_fault_card<RefusedBlock>(image, co, "open", &dev);
    if (!s) return;
    g_older_header = store_both(*s, *dev, *image);
  }
  bool held = false;
  {
    OlderHeaderUnwritable* dev;
    auto s = adp::testing::checked_fault_card<OlderHeaderUnwritable>(image, co, "the open finding both copies", &dev);
    if (!s) return;
    check(adp::testing::read_object(*s, "pad").has_value(), "the pad loads");  // its region refreshed, as above
    fill(*s);
    held = s->exists("key");
    dev->power_cut();
  }
  check_reopened(image, held, " (found at the open)");
}

}  // namespace

int main() {
  superseded_copy_stays_dead(true);
  superseded_copy_stays_dead(false);
  superseded_copy_found_at_the_open_stays_dead();
  return adp::testing::finish("continuation_guard_test");
}
