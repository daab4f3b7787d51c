// SPDX-License-Identifier: Apache-2.0
// The tombstone of an older copy found at an open (a Location with no key: write_tombstone reads the key from
// the copy's header), on a fault device. The open's tombstone write lands but its sync fails, so it is retried
// at the next store:
//   - the retry reads the tombstone already written there: it writes it again with its key, not keyless (a
//     keyless tombstone orders no delete of the key);
//   - the retry cannot read the header: the failed read is counted in io_errors (and logged), as other failed
//     reads of the card are.
// Built and run by tests/store/test_tombstone_race.py.
#include <cstdint>
#include <cstring>
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

// A fault device whose second sync fails: at the open, the first syncs the pad of the region's free tail (the
// walk's end), the second the tombstones of the older copies.
struct TombstoneSyncFails : FaultDevice {
  TombstoneSyncFails(std::shared_ptr<FaultImage> image, std::string name) : FaultDevice(std::move(image), name) {
    fail_sync(1);
  }
};

// The header fields of the block at `at`: flags and key_bytes (card_format.h, ObjectHeader at 48 and 52).
uint32_t field(const FaultImage& image, uint64_t at, size_t off) {
  uint32_t v;
  std::memcpy(&v, image.data.data() + at + off, sizeof v);
  return v;
}

void stale_copy_tombstone_retried(bool unreadable) {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  const std::vector<uint8_t> v1(20000, 1), v2(20000, 2);
  uint64_t h1;
  {
    FaultDevice* dev;
    auto s = adp::testing::checked_fault_card(image, kCard, "open", &dev);
    if (!s) return;
    adp::IoContext ctx;
    check(adp::testing::put_one(*s, ctx, "key", v1).ok(), "first store of key");
    h1 = adp::testing::header_block(*image, "key");
    dev->fail_writes(h1, h1 + adp::kBlockSize);  // the older copy's tombstone cannot be written
    check(adp::testing::put_one(*s, ctx, "key", v2).ok(), "second store of key");
  }
  check(field(*image, h1, 48) == 0, "the older copy is live on the card");
  TombstoneSyncFails* dev;
  auto s = adp::testing::checked_fault_card<TombstoneSyncFails>(image, kCard, "reopen", &dev);
  if (!s) return;
  check(field(*image, h1, 48) & adp::kObjectDeleted, "the open wrote the older copy's tombstone (its sync failed)");
  check(field(*image, h1, 52) == 3, "with its key");
  const uint64_t io_errors = s->stats().io_errors;
  check(io_errors == 1, "the open's sync of the tombstone failed: it is pending");
  if (unreadable) dev->fail_reads(h1, h1 + adp::kBlockSize);
  adp::IoContext ctx;
  check(adp::testing::put_one(*s, ctx, "other", v1).ok(), "a store: the tombstone is retried");
  if (unreadable) {
    check(s->stats().io_errors == io_errors + 1, "the failed read of the header is counted: io_errors " +
                                                     std::to_string(s->stats().io_errors) + ", was " +
                                                     std::to_string(io_errors));
  } else {
    check(field(*image, h1, 48) & adp::kObjectDeleted, "the retry wrote the tombstone");
    check(field(*image, h1, 52) == 3, "the retry kept its key: key_bytes " + std::to_string(field(*image, h1, 52)));
  }
  check(adp::testing::read_object(*s, "key") == v2, "key reads its newer copy");
}

}  // namespace

int main() {
  stale_copy_tombstone_retried(false);
  stale_copy_tombstone_retried(true);
  return adp::testing::finish("stale_tombstone_test");
}
