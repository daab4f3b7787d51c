// SPDX-License-Identifier: Apache-2.0
// Eviction's LRU and objects that span regions (docs/card_format.md, Writing: "A sealed region's LRU age is its
// last read or write"; "Eviction takes the least recently used sealed region (reads and lookups refresh a
// region ...) [and] drops from the index every object with bytes in it"). A load (read_and_check, get_via_bounce)
// and exists() refresh only the region of the object's header block (regions_.touch(e.region)), not the regions
// it continues into; so a region holding only an object's continuation (and the start of colder objects) ages
// from its opening, and evicting it drops the object however often it is read. An object spans regions whenever
// it is larger than a region's tail: LMCache's 32 MiB chunk on a 2 GiB card (16 MiB regions) always does.
// Here: 8 regions of 1 MiB, objects of 1.5 MiB; one object read (and asked for) before every store of the
// others, so it is always the most recently used; after 3 cards' worth of stores it must still be held.
// Fails on the code of session 32 (review33a F2): the hot object is evicted with its continuation's region.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::testing::check;
using adp::testing::FaultImage;

constexpr uint64_t kRegion = 1u << 20;
constexpr uint64_t kRegions = 8;

void hot_spanning_object_stays() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  auto s = adp::testing::checked_fault_card(image, adp::testing::card_options(kRegion), "open");
  if (!s) return;
  adp::IoContext ctx;
  const std::vector<uint8_t> hot(3 * kRegion / 2, 1), cold(3 * kRegion / 2, 2);
  check(adp::testing::put_one(*s, ctx, "model@0@0@hot", hot).ok(), "store of the hot object");
  int lost_at = -1;
  for (int i = 0; i < 16 && lost_at < 0; i++) {  // 16 x 1.5 MiB: 3 cards
    if (!s->exists("model@0@0@hot") || adp::testing::read_object(*s, ctx, "model@0@0@hot") != hot) lost_at = i;
    check(adp::testing::put_one(*s, ctx, "model@0@0@cold" + std::to_string(i), cold).ok(), "store of a cold one");
  }
  if (lost_at < 0 && adp::testing::read_object(*s, ctx, "model@0@0@hot") != hot) lost_at = 16;
  check(lost_at < 0, "the object read before every store (the most recently used) was evicted before cold store " +
                         std::to_string(lost_at) + " (" + std::to_string(s->stats().evicted_objects) +
                         " objects evicted in all)");
}

}  // namespace

int main() {
  hot_spanning_object_stays();
  return adp::testing::finish("lru_span_test");
}
