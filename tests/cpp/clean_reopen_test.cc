// SPDX-License-Identifier: Apache-2.0
// An open after a clean close writes nothing (docs/card_format.md, Recovery):
// the close pads the frontier region's unwritten tail, so the next open's walk
// finds no cut to pad. On a fault device, built and run by
// tests/store/test_recovery_damage.py.
//   - Clean close, open, close: no write and no sync at the open, the image
//     byte-identical; the same after a session that stored more.
//   - After a power cut (no close) the open still pads the frontier's tail.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

constexpr uint64_t kRegion = 1u << 20;
constexpr size_t kSize = 20000;
const adp::CardOptions kCard = adp::testing::card_options(kRegion);

using adp::IoContext;
using adp::testing::check;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;

std::vector<uint8_t> value(int i) {
  std::vector<uint8_t> v(kSize);
  for (size_t j = 0; j < kSize; j++) v[j] = static_cast<uint8_t>(i * 131 + j * 7);
  return v;
}

// Opens the card, stores keys [from, to), and closes it (cleanly, or with a power cut first).
void session(const std::shared_ptr<FaultImage>& image, int from, int to, bool power_cut = false) {
  FaultDevice* dev;
  auto s = adp::testing::checked_fault_card(image, kCard, "open to store", &dev);
  if (!s) return;
  IoContext ctx;
  for (int i = from; i < to; i++)
    check(adp::testing::put_one(*s, ctx, "key-" + std::to_string(i), value(i)).ok(), "store key-" + std::to_string(i));
  if (power_cut) dev->power_cut();
}

// Opens and closes the card, storing nothing: what the open wrote and synced, and that every key below `n` reads.
void open_and_close(const std::shared_ptr<FaultImage>& image, int n, const std::string& what) {
  const std::vector<uint8_t> before = image->data;
  {
    FaultDevice* dev;
    auto s = adp::testing::checked_fault_card(image, kCard, what, &dev);
    if (!s) return;
    check(dev->writes() == 0 && dev->syncs() == 0, what +
                                                       ": the open writes nothing: " + std::to_string(dev->writes()) +
                                                       " writes, " + std::to_string(dev->syncs()) + " syncs");
    for (int i = 0; i < n; i++)
      check(adp::testing::read_object(*s, "key-" + std::to_string(i)) == value(i),
            what + ": key-" + std::to_string(i) + " reads back");
  }
  check(image->data == before, what + ": open and close leave the image byte-identical");
}

void clean_close_then_open() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  session(image, 0, 5);
  open_and_close(image, 5, "after a clean close");
  open_and_close(image, 5, "again");
  session(image, 5, 70);  // into a second region
  open_and_close(image, 70, "after a session that stored more");
}

void power_cut_then_open() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  session(image, 0, 5, true);
  {
    FaultDevice* dev;
    auto s = adp::testing::checked_fault_card(image, kCard, "after a power cut", &dev);
    if (!s) return;
    check(dev->writes() == 1 && dev->syncs() == 1,
          "after a power cut the open pads the frontier's tail: " + std::to_string(dev->writes()) + " writes, " +
              std::to_string(dev->syncs()) + " syncs");
  }
  open_and_close(image, 5, "after the padded open");
}

}  // namespace

int main() {
  clean_close_then_open();
  power_cut_then_open();
  return adp::testing::finish("clean_reopen_test");
}
