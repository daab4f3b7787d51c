// SPDX-License-Identifier: Apache-2.0
// DESIGN.md: "Damage is local. A bad block costs the objects on it, never the card"; "when full it evicts ... on
// its own". A region whose header write fails when the frontier opens it goes back to the free list, to be handed
// out after every other free region (CardStore::advance_frontier, regions_.fail_open). On a full card there is no
// other free region: the next reservation takes that same region again (take_free before any eviction), its
// header write fails again, and the store fails; so does every store after it, for as long as the block refuses
// writes. One bad 4 KiB block (a region header) turns a full card read-only.
// Here: 8 regions of 1 MiB; region 0's header block refuses writes once the card is written; the card filled
// past its first eviction, then 40 more stores: at most the one whose eviction met the bad block may fail.
// Fails on the code of session 32 (review33a F5): every store after the first failure fails.
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

void one_bad_region_header_keeps_the_card_storing() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  FaultDevice* dev;
  auto s = adp::testing::checked_fault_card(image, adp::testing::card_options(kRegion), "open", &dev);
  if (!s) return;
  adp::IoContext ctx;
  const std::vector<uint8_t> value(200000, 9);
  int i = 0;
  for (; s->stats().free_regions > 0 || i < 8; i++)
    check(adp::testing::put_one(*s, ctx, "model@0@0@" + std::to_string(i), value).ok(), "fill");
  dev->fail_writes(adp::kDataOffset, adp::kDataOffset + adp::kBlockSize);  // region 0's header: a bad block
  int failed = 0;
  for (int k = 0; k < 40; k++, i++)
    failed += !adp::testing::put_one(*s, ctx, "model@0@0@" + std::to_string(i), value).ok();
  check(failed <= 1, std::to_string(failed) + " of 40 stores failed on a card with one bad region header block (" +
                         std::to_string(s->stats().free_regions) + " free regions, " +
                         std::to_string(s->stats().objects) + " objects)");
}

}  // namespace

int main() {
  one_bad_region_header_keeps_the_card_storing();
  return adp::testing::finish("bad_region_header_test");
}
