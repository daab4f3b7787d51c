// SPDX-License-Identifier: Apache-2.0
// A load that reads an object's header while a delete writes its tombstone
// over it (the race behind connector_stress's rare "header damaged" under
// ASan, session sixteen): remove() writes the tombstone while the object is
// still indexed, and the write is not atomic to a reader (a memcpy into a
// mapping, or the kernel's copy into tmpfs pages), so the load may read a
// header half old, half tombstone. That is a miss (the key is being
// deleted), not damage: no checksum failure is counted, the entry is not
// dropped by the load, and the delete itself still succeeds.
//
// Deterministic: the delete's tombstone write is held (FaultDevice), the
// header on the image is left as a half-done write would leave it, then
// loaded; a header damaged the same way with no delete in flight must still
// count as damage and be dropped.
//
//   tombstone_race_test
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::CardStore;
using adp::IoContext;
using adp::Status;
using adp::testing::check;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;

constexpr uint64_t kRegionBytes = 1ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(16, kRegionBytes);

}  // namespace

int main() {
  auto image = std::make_shared<FaultImage>(kCardBytes);
  FaultDevice* dev = nullptr;
  std::unique_ptr<CardStore> s =
      adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes), "open", &dev, "race-card");
  if (!s) return 1;
  IoContext ctx;
  const std::vector<uint8_t> a = adp::testing::pattern(100000, 1), d = adp::testing::pattern(50000, 2);
  check(adp::testing::put_one(*s, ctx, "race@key@deleted", a).ok(), "the store of the deleted key succeeds");
  check(adp::testing::put_one(*s, ctx, "race@key@damaged", d).ok(), "the store of the damaged key succeeds");
  const uint64_t ha = adp::testing::header_block(*image, "race@key@deleted"),
                 hd = adp::testing::header_block(*image, "race@key@damaged");
  check(ha != UINT64_MAX && hd != UINT64_MAX, "both headers are found on the image");
  if (adp::testing::check_failures) return adp::testing::finish("tombstone_race_test");

  // The delete of a: its tombstone write held before it touches the image, the object still indexed.
  adp::testing::HeldDelete remover(*s, *dev, "race@key@deleted");
  adp::testing::half_overwrite(*image, ha);  // the tombstone half written, as a concurrent load can see it

  Status got;
  auto bytes = adp::testing::read_object(*s, "race@key@deleted", &got);
  check(!bytes && got.is_not_found(), "a load racing the delete's tombstone is a miss: '" + got.message() + "'");
  check(s->stats().checksum_failures == 0, "a load racing the delete's tombstone counts no checksum failure (" +
                                               std::to_string(s->stats().checksum_failures) + ")");

  const Status removed = remover.finish();
  check(removed.ok(), "the delete whose tombstone a load raced succeeds: '" + removed.message() + "'");
  check(s->stats().deletes == 1, "the delete is counted (" + std::to_string(s->stats().deletes) + ")");
  check(!adp::testing::read_object(*s, "race@key@deleted"), "the deleted key is gone");

  // The same bytes damaged with no delete in flight: damage, counted once and dropped.
  adp::testing::half_overwrite(*image, hd);
  bytes = adp::testing::read_object(*s, "race@key@damaged", &got);
  check(!bytes && got.is_not_found(), "a damaged header is served as a miss: '" + got.message() + "'");
  check(s->stats().checksum_failures == 1, "a damaged header with no delete in flight is a checksum failure (" +
                                               std::to_string(s->stats().checksum_failures) + ")");
  const uint64_t failures = s->stats().checksum_failures;
  check(!adp::testing::read_object(*s, "race@key@damaged") && s->stats().checksum_failures == failures,
        "the damaged object was dropped: a second load is a miss without reading it again");
  return adp::testing::finish("tombstone_race_test");
}
