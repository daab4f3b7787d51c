// SPDX-License-Identifier: Apache-2.0
// Recovery resumes its walk behind a damaged object header (docs/card_format.md,
// Recovery, "Damage that reads back wrong"), on a fault device. Built and run
// by tests/store/test_recovery_damage.py, and under ASan+UBSan and TSan by
// tests/sanitizers/test_sanitizers.py.
//   - Damaged headers (two in one region, one of a record continuing into the
//     next region): every other object reads back, the damage costs its
//     records only.
//   - A store behind a hole that could not be marked (its write failed, then
//     the pad over it): not acknowledged, and its copy on the card voided. A
//     walk resumed behind damage in front of the hole finds that copy; with
//     its own seq it would outrank a delete of its key acknowledged after it
//     failed, and the deleted key would be back.
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::IoContext;
using adp::testing::check;
using adp::testing::FaultImage;
using adp::testing::header_block;

constexpr uint64_t kRegion = 1u << 20;
const adp::CardOptions kCard = adp::testing::card_options(kRegion);

std::vector<uint8_t> value(int i, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t j = 0; j < n; j++) v[j] = static_cast<uint8_t>(i * 131 + j * 7);
  return v;
}

// Flips a bit of the payload_bytes field of key's header: its checksum fails.
void damage(FaultImage& image, const std::string& key) { image.data[header_block(image, key) + 40] ^= 1; }

void damaged_headers_cost_their_records() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  constexpr size_t kSize = 300 << 10;  // footprint 304 KiB: the fourth continues into the next region
  std::vector<std::string> keys;
  {
    auto s = adp::testing::checked_fault_card(image, kCard, "open");
    if (!s) return;
    IoContext ctx;
    for (int i = 0; i < 9; i++) {
      keys.push_back("obj-" + std::to_string(i));
      check(adp::testing::put_one(*s, ctx, keys.back(), value(i, kSize)).ok(), "store " + keys.back());
    }
  }
  for (const char* k : {"obj-1", "obj-3"}) damage(*image, k);  // obj-3 continues into the next region
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  adp::StoreStats st = s->stats();
  check(st.recovery_damaged_regions == 1 && st.recovery_lost_objects == 2, "two damaged headers, two records lost");
  check(st.recovery_lost_bytes == 2 * kSize, "their bytes: both records' payload");
  for (int i = 0; i < 9; i++) {
    bool lost = keys[i] == "obj-1" || keys[i] == "obj-3";
    auto got = adp::testing::read_object(*s, keys[i]);
    check(lost ? !got : got == value(i, kSize), keys[i] + (lost ? " is a miss" : " reads back"));
  }
}

void store_behind_an_unmarked_hole_is_voided() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  constexpr size_t kSize = 20000;
  const auto v1 = value(1, kSize), front = value(2, kSize), a = value(3, kSize), v2 = value(4, kSize);
  {
    adp::testing::FaultDevice* dev;
    auto s = adp::testing::checked_fault_card(image, kCard, "open", &dev);
    if (!s) return;
    IoContext c0, ca, cb;
    check(adp::testing::put_one(*s, c0, "k", v1).ok(), "first store of k");
    check(adp::testing::put_one(*s, c0, "front", front).ok(), "store of front");
    const uint64_t a_at = header_block(*image, "front") + adp::object_footprint(kSize);
    const uint64_t w0 = dev->writes();
    dev->hold_write(w0);  // A's record write: stuck in flight
    adp::Status ar, br;
    std::thread ta([&] { ar = adp::testing::put_one(*s, ca, "a", a); });
    while (!dev->write_held()) std::this_thread::yield();
    std::thread tb([&] { br = adp::testing::put_one(*s, cb, "k", v2); });  // reserved behind A: written, waits for A
    while (dev->writes() < w0 + 2) std::this_thread::yield();
    dev->fail_writes(a_at, a_at + adp::kBlockSize);  // A's pad cannot be written either
    dev->release_held_write(true);
    ta.join();
    tb.join();
    check(!ar.ok(), "the store whose write failed is not acknowledged");
    check(br.message().find("could not be marked") != std::string::npos,
          "the store behind the unmarked hole fails: " + br.message());
    adp::Status d = s->remove(c0, "k");
    check(d.ok(), "the delete of k after its store failed: " + d.message());
    dev->power_cut();
  }
  damage(*image, "front");  // in front of the hole: the walk resumes behind it
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  check(s->stats().recovery_damaged_regions == 1, "front's header is damage");
  auto got = adp::testing::read_object(*s, "k");
  check(!got,
        std::string("k was deleted after its store failed and is back") + (got == v2 ? " (the failed copy)" : ""));
}

}  // namespace

int main() {
  damaged_headers_cost_their_records();
  store_behind_an_unmarked_hole_is_voided();
  return adp::testing::finish("damage_resume_test");
}
