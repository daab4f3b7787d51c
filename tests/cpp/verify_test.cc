// SPDX-License-Identifier: Apache-2.0
// CardStore::verify counts only what it read and judged as checked (review
// r16, left by e74cde5):
//   - an object whose read finds it deleted meanwhile (a delete's tombstone
//     over its header, as tombstone_race_test makes it: none while verify
//     holds the card alone) is counted gone, not checked;
//   - an object verify has no memory to read into (its read buffer's mapping
//     refused: the address space limited here with RLIMIT_AS) is counted
//     no_memory, not checked and not bad (no fault of the object's), and
//     --repair leaves it; with the memory back it is checked, and good.
//
//   verify_test
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::CardStore;
using adp::IoContext;
using adp::Status;
using adp::VerifyReport;
using adp::testing::check;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;

constexpr uint64_t kRegionBytes = 4ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(16, kRegionBytes);
constexpr size_t kSmall = 100000, kBig = 20u << 20;

VerifyReport verify(CardStore& s, bool repair = false) {
  IoContext ctx;  // a new one: its read buffer grows from nothing
  VerifyReport r;
  Status st = s.verify(ctx, repair, [](uint64_t, uint64_t) {}, &r);
  check(st.ok(), "verify runs: '" + st.message() + "'");
  return r;
}

std::string counts(const VerifyReport& r) {
  return "checked " + std::to_string(r.checked) + ", bad " + std::to_string(r.bad) + ", no_memory " +
         std::to_string(r.no_memory) + ", gone " + std::to_string(r.gone) +
         (r.bad_objects.empty() ? "" : ", first bad: " + r.bad_objects[0]);
}

}  // namespace

int main() {
  auto image = std::make_shared<FaultImage>(kCardBytes);
  FaultDevice* dev = nullptr;
  std::unique_ptr<CardStore> s =
      adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes), "open", &dev, "verify-card");
  if (!s) return 1;
  {
    IoContext ctx;
    for (int i = 0; i < 3; i++)
      check(adp::testing::put_one(*s, ctx, "verify@small@" + std::to_string(i), adp::testing::pattern(kSmall, i)).ok(),
            "a small store succeeds");
    check(adp::testing::put_one(*s, ctx, "verify@big", adp::testing::pattern(kBig, 7)).ok(), "the big store succeeds");
    check(adp::testing::put_one(*s, ctx, "verify@gone", adp::testing::pattern(kSmall, 9)).ok(),
          "the store of the key deleted during verify succeeds");
  }
  const uint64_t gone_header = adp::testing::header_block(*image, "verify@gone");
  check(gone_header != UINT64_MAX, "the deleted key's header is found on the image");
  if (adp::testing::check_failures) return adp::testing::finish("verify_test");

  // Deleted while verify reads it: the delete's tombstone write held with the key still indexed, its header
  // left half overwritten (as a load racing the delete can read it).
  adp::testing::HeldDelete remover(*s, *dev, "verify@gone");
  adp::testing::half_overwrite(*image, gone_header);
  VerifyReport r = verify(*s);
  check(r.gone == 1 && r.checked == 4 && r.bad == 0 && r.no_memory == 0,
        "an object deleted while verify read it is gone, not checked (" + counts(r) + ")");
  check(r.bytes == 3 * kSmall + kBig, "only the objects checked count their bytes (" + std::to_string(r.bytes) + ")");
  const Status removed = remover.finish();
  check(removed.ok(), "the delete succeeds: '" + removed.message() + "'");

  // No memory for the big object's read buffer: the address space held to what it is now and a few MiB.
  VerifyReport repaired;
  {
    adp::testing::AddressSpaceLimit limit(8u << 20);
    r = verify(*s);
    repaired = verify(*s, true);
  }
  check(r.no_memory == 1 && r.no_memory_bytes == kBig && r.checked == 3 && r.bad == 0 && r.bad_objects.empty() &&
            r.gone == 0,
        "an object verify had no memory to read is counted apart, not checked and not bad (" + counts(r) + ")");
  check(repaired.no_memory == 1 && repaired.repaired == 0 && repaired.bad == 0,
        "--repair drops no object it had no memory to read (" + counts(repaired) + ")");
  check(adp::testing::read_object(*s, "verify@big").has_value(), "the big object is still on the card");
  r = verify(*s);
  check(r.checked == 4 && r.bad == 0 && r.no_memory == 0 && r.gone == 0,
        "with the memory back, every object is checked, and good (" + counts(r) + ")");
  return adp::testing::finish("verify_test");
}
