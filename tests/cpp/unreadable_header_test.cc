// SPDX-License-Identifier: Apache-2.0
// DESIGN.md: "Damage is local. A bad block costs the objects on it, never the card." An object header block that
// cannot be read at open (a bad sector) costs its own record only: recovery's walk goes on behind it, as behind a
// header that reads back wrong (recovery.cc, scan_region; skip_damage), and a read-write open pads over the span it
// stepped over, from the block to where it resumed, not to the region's end (docs/card_format.md, Recovery,
// "Damaged media"). Cases, each on 8 regions of 1 MiB:
//   - objects_behind_stay: 20 objects of 100 KiB, the 2nd one's header block unreadable at the reopen; the objects
//     behind it in region 0 (the 3rd to the 9th) load, at that open and at the next (the block readable again:
//     the pad over the 2nd hides only it). Failed on the code of session 32 (review33a F4): all of them lost.
//   - unseen_last_record_stays_hidden: the unreadable header is the card's last record (a key's newer copy, the
//     highest seq); the first store after that open, of the same key, gets that seq again; once the block is
//     readable, the copy the open could not see must not win over it. Fails without the pad over the span.
//   - pad_refused_hides_only_the_span: the block refuses writes too, so the pad is not written; the headers
//     behind the span must not be zeroed in its place (CardStore::hide_behind reads to the span's end, not the
//     region's): the objects behind still load. Fails with hide_behind to the region's end.
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
uint64_t g_bad = 0;         // the unreadable block
bool g_unwritable = false;  // and it refuses writes

struct BadBlock : FaultDevice {
  BadBlock(std::shared_ptr<FaultImage> image, std::string name) : FaultDevice(std::move(image), name) {
    fail_reads(g_bad, g_bad + adp::kBlockSize);
    if (g_unwritable) fail_writes(g_bad, g_bad + adp::kBlockSize);
  }
};

std::string key(int i) { return "model@0@0@" + std::to_string(i); }

// A card holding key(0) .. key(19), 100 KiB each (9 in region 0), and the index of the last in region 0.
std::shared_ptr<FaultImage> twenty_objects(const std::vector<uint8_t>& value, int* last_in_region0) {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  {
    auto s = adp::testing::checked_fault_card(image, kCard, "open");
    adp::IoContext ctx;
    for (int i = 0; s && i < 20; i++) check(adp::testing::put_one(*s, ctx, key(i), value).ok(), "store");
  }
  *last_in_region0 = 1;
  while (adp::testing::header_block(*image, key(*last_in_region0 + 1)) < adp::kDataOffset + kRegion)
    (*last_in_region0)++;
  return image;
}

// The objects key(2) .. key(last) lost at an open of `s` (behind key(1), in region 0).
int lost_behind(adp::CardStore& s, const std::vector<uint8_t>& value, int last) {
  int lost = 0;
  for (int i = 2; i <= last; i++) lost += adp::testing::read_object(s, key(i)) != value;
  return lost;
}

void objects_behind_stay(bool unwritable) {
  const char* what = unwritable ? "pad refused" : "objects behind";
  const std::vector<uint8_t> value(100 * 1024, 5);
  int last = 0;
  auto image = twenty_objects(value, &last);
  g_bad = adp::testing::header_block(*image, key(1));
  g_unwritable = unwritable;
  check(g_bad < adp::kDataOffset + kRegion && last >= 2, "key 1's header and some behind it are in region 0");
  {
    auto s = adp::testing::checked_fault_card<BadBlock>(image, kCard, "reopen with key 1's header block unreadable");
    if (!s) return;
    const adp::StoreStats st = s->stats();
    check(st.media_errors == 1 && st.recovery_damaged_regions == 0,
          std::string(what) + ": one media error, no damage read back: media_errors " +
              std::to_string(st.media_errors) + ", damaged regions " + std::to_string(st.recovery_damaged_regions));
    check(!adp::testing::read_object(*s, key(1)), std::string(what) + ": key 1 is a miss");
    const int lost = lost_behind(*s, value, last);
    check(lost == 0, std::string(what) + ": " + std::to_string(lost) + " of the " + std::to_string(last - 1) +
                         " objects behind the unreadable block in its region lost for one 4 KiB block");
    check(adp::testing::read_object(*s, key(0)) == value && adp::testing::read_object(*s, key(19)) == value,
          std::string(what) + ": the objects in front and in the other regions load");
  }
  g_unwritable = false;
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen, the block readable again");
  if (!s) return;
  const int lost = lost_behind(*s, value, last);
  check(lost == 0, std::string(what) + ": at the next open " + std::to_string(lost) + " of the " +
                       std::to_string(last - 1) + " objects behind the block lost");
  if (!unwritable)
    check(!adp::testing::read_object(*s, key(1)), std::string(what) + ": key 1, padded over, stays a miss");
}

void unseen_last_record_stays_hidden() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  const std::vector<uint8_t> small(100 * 1024, 1), v1(100 * 1024, 2), v2(100 * 1024, 3), v3(100 * 1024, 4);
  {
    auto s = adp::testing::checked_fault_card(image, kCard, "open");
    if (!s) return;
    adp::IoContext ctx;
    check(adp::testing::put_one(*s, ctx, key(0), small).ok(), "store key 0");
    check(adp::testing::put_one(*s, ctx, "model@0@0@last", v1).ok(), "store last v1");
    check(adp::testing::put_one(*s, ctx, key(1), small).ok(), "store key 1");
    check(adp::testing::put_one(*s, ctx, "model@0@0@last", v2).ok(), "store last v2 (the highest seq)");
  }
  const std::string needle = "model@0@0@last";
  // v2's header block: right behind key 1's record.
  g_bad = adp::testing::header_block(*image, key(1)) + adp::object_footprint(small.size());
  g_unwritable = false;
  check(std::string(image->data.begin() + g_bad, image->data.begin() + g_bad + adp::kBlockSize).find(needle) !=
            std::string::npos,
        "last v2's header block follows key 1's record");
  {
    auto s = adp::testing::checked_fault_card<BadBlock>(image, kCard, "reopen with last v2's header unreadable");
    if (!s) return;
    check(!adp::testing::read_object(*s, needle), "last is a miss (v1 superseded, v2 unreadable)");
    adp::IoContext ctx;
    check(adp::testing::put_one(*s, ctx, needle, v3).ok(), "last v3 stored, the first store after the open");
    check(adp::testing::read_object(*s, needle) == v3, "last reads v3");
  }
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen, the block readable again");
  if (!s) return;
  auto got = adp::testing::read_object(*s, needle);
  check(got == v3, std::string("last, stored after the open that could not read v2, is ") +
                       (!got        ? "a miss"
                        : got == v2 ? "v2 (the copy that open never saw)"
                                    : "other bytes"));
}

}  // namespace

int main() {
  objects_behind_stay(false);
  unseen_last_record_stays_hidden();
  objects_behind_stay(true);
  return adp::testing::finish("unreadable_header_test");
}
