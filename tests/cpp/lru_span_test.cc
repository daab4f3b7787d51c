// SPDX-License-Identifier: Apache-2.0
// Eviction's LRU and objects that span regions (docs/card_format.md, Writing: "A sealed region's LRU age is its
// last read or write"; "Eviction takes the least recently used sealed region (reads and lookups refresh a
// region ...) [and] drops from the index every object with bytes in it"). A load (read_and_check, get_via_bounce)
// and exists() refresh only the region of the object's header block (regions_.touch(e.region)), not the regions
// it continues into; so a region holding only an object's continuation (and the start of colder objects) ages
// from its opening, and evicting it drops the object however often it is read. An object spans regions whenever
// it is larger than a region's tail: LMCache's 32 MiB chunk on a 2 GiB card (16 MiB regions) always does.
// Here: 8 regions of 1 MiB, objects of 1.5 MiB; one object used before every store of the others, so it is always
// the most recently used; after 3 cards' worth of stores it must still be held. Once for each way a use refreshes
// the regions: exists() alone, get (read_and_check, on a FaultDevice: pread) alone, get_via_bounce alone (on a
// MappedFaultDevice: the memory-speed path with its own first look).
// Failed on the code of session 32 (review33a F2) in each way: the hot object evicted with its continuation's
// region before the 6th cold store.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/mapped_fault_device.h"

namespace {

using adp::testing::check;
using adp::testing::FaultImage;

constexpr uint64_t kRegion = 1u << 20;
constexpr uint64_t kRegions = 8;

enum class Use { kExists, kGet, kBounce };

// Whether the object under key is there with the bytes `want`, asked the way `use` says.
bool used(adp::CardStore& s, adp::IoContext& ctx, Use use, const std::string& key, const std::vector<uint8_t>& want) {
  if (use == Use::kExists) return s.exists(key);
  if (use == Use::kGet) return adp::testing::read_object(s, ctx, key) == want;
  std::vector<uint8_t> out(want.size());
  adp::AlignedBuffer bounces[1], hold;
  auto with_ctx = [&](const std::function<void(adp::IoContext&)>& fn) {
    fn(ctx);
    return true;
  };
  auto sink = [&](size_t done, const uint8_t* src, size_t len) {
    std::memcpy(out.data() + done, src, len);
    return true;
  };
  adp::Status st =
      s.get_via_bounce(key, [&](size_t size) { return size == want.size(); }, with_ctx, {bounces, 1}, &hold, sink);
  return st.ok() && out == want;
}

void hot_spanning_object_stays(Use use, const char* what) {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  const auto co = adp::testing::card_options(kRegion);
  auto s = use == Use::kBounce ? adp::testing::checked_fault_card<adp::testing::MappedFaultDevice>(image, co, "open")
                               : adp::testing::checked_fault_card(image, co, "open");
  if (!s) return;
  adp::IoContext ctx;
  const std::vector<uint8_t> hot(3 * kRegion / 2, 1), cold(3 * kRegion / 2, 2);
  check(adp::testing::put_one(*s, ctx, "model@0@0@hot", hot).ok(), "store of the hot object");
  int lost_at = -1;
  for (int i = 0; i < 16 && lost_at < 0; i++) {  // 16 x 1.5 MiB: 3 cards
    if (!used(*s, ctx, use, "model@0@0@hot", hot)) lost_at = i;
    check(adp::testing::put_one(*s, ctx, "model@0@0@cold" + std::to_string(i), cold).ok(), "store of a cold one");
  }
  if (lost_at < 0 && adp::testing::read_object(*s, ctx, "model@0@0@hot") != hot) lost_at = 16;
  check(lost_at < 0, std::string(what) + ": the object used before every store (the most recently used) was " +
                         "evicted before cold store " + std::to_string(lost_at) + " (" +
                         std::to_string(s->stats().evicted_objects) + " objects evicted in all)");
  if (lost_at < 0)
    check(s->stats().evicted_objects >= 8, std::string(what) + ": the cold stores evicted (the test's premise)");
}

}  // namespace

int main() {
  hot_spanning_object_stays(Use::kExists, "exists");
  hot_spanning_object_stays(Use::kGet, "get");
  hot_spanning_object_stays(Use::kBounce, "get_via_bounce");
  return adp::testing::finish("lru_span_test");
}
