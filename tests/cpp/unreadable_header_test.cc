// SPDX-License-Identifier: Apache-2.0
// DESIGN.md: "Damage is local. A bad block costs the objects on it, never the card." An object header block that
// cannot be read at open (a bad sector) ends its region's walk (recovery.cc, scan_region: scan->cut_at, "the rest
// of the region is lost", docs/card_format.md, Recovery, "Damaged media"), and the read-write open pads over it to
// the region's end, so every object behind it in the region is lost for good: up to a region (1/128 of a card by
// default, up to 256 MiB) for one 4 KiB block. A header that reads back wrong costs its own record only (the walk
// resumes at the next header of the region's epoch that checks out: skip_damage, session 20); an unreadable one
// could be stepped over the same way (no crash leaves an unreadable block).
// Here: 8 regions of 1 MiB, 20 objects of 100 KiB; the header block of the 2nd object (region 0) unreadable at
// the reopen; the objects behind it in region 0 (the 3rd to the 9th) must still load.
// Fails on the code of session 32 (review33a F4): 7 objects lost for one block.
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
const adp::CardOptions kCard = adp::testing::card_options(kRegion);
uint64_t g_bad = 0;  // the unreadable block

struct BadBlock : FaultDevice {
  BadBlock(std::shared_ptr<FaultImage> image, std::string name) : FaultDevice(std::move(image), name) {
    fail_reads(g_bad, g_bad + adp::kBlockSize);
  }
};

std::string key(int i) { return "model@0@0@" + std::to_string(i); }

void one_unreadable_header_costs_its_object() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  const std::vector<uint8_t> value(100 * 1024, 5);
  {
    auto s = adp::testing::checked_fault_card(image, kCard, "open");
    if (!s) return;
    adp::IoContext ctx;
    for (int i = 0; i < 20; i++) check(adp::testing::put_one(*s, ctx, key(i), value).ok(), "store");
  }
  g_bad = adp::testing::header_block(*image, key(1));
  check(g_bad < adp::kDataOffset + kRegion, "key 1's header is in region 0");
  auto s = adp::testing::checked_fault_card<BadBlock>(image, kCard, "reopen with key 1's header block unreadable");
  if (!s) return;
  int lost = 0, same_region = 0;
  for (int i = 2; i < 20; i++) {
    if (adp::testing::header_block(*image, key(i)) >= adp::kDataOffset + kRegion) break;
    same_region++;
    lost += !adp::testing::read_object(*s, key(i)).has_value();
  }
  check(same_region > 0, "objects behind key 1 in region 0");
  check(lost == 0, std::to_string(lost) + " of the " + std::to_string(same_region) +
                       " objects behind the unreadable block in its region lost for one 4 KiB block");
}

}  // namespace

int main() {
  one_unreadable_header_costs_its_object();
  return adp::testing::finish("unreadable_header_test");
}
