// SPDX-License-Identifier: Apache-2.0
// A failed sync that loses for good the writes the device took before it failed (FaultDevice::lose_failed_sync_writes:
// a failed cache flush, dirty pages the kernel dropped) must leave no store acknowledged whose recovery needs one of
// them (util/group_sync.h; docs/card_format.md, Writing). On one region:
//   - store A writes its record and is held before its sync (as a store waiting for the stores in front of it);
//   - store C, reserved behind A, has its record's write held (not yet done);
//   - a delete's sync runs and fails, losing A's record (and the delete's tombstone);
//   - C's write completes and C syncs: answered by the next sync, which succeeds; C's own record is durable, but
//     recovery's walk of the region stops at A's lost record in front of it;
//   - A syncs: answered by a later sync that succeeds; its own record is lost;
//   - store D comes after: it must not be placed behind A's lost record.
// A and C must be failed (not acknowledged); D acknowledged. After a power cut and a reopen every store
// acknowledged is back with its bytes. Until session 31 A and C were acknowledged (the sync that answered them
// succeeded) and lost at the reopen, and D too (placed behind the hole). Built and run by
// tests/store/test_crash_consistency.py (and under the sanitizers: tests/sanitizers/test_sanitizers.py).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "held_sync.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::Status;
using adp::testing::FaultImage;
using adp::testing::HeldSync;

// One region holds K0, A and C: A's lost record is in front of C's.
constexpr uint64_t kRegions = 8, kRegion = 1u << 20;
const adp::CardOptions kCard = adp::testing::card_options(kRegion);

std::vector<uint8_t> value(uint8_t fill, size_t size) { return std::vector<uint8_t>(size, fill); }

// Up to 10 s for cond (a held write reached: an event, not a guess at a time).
template <typename F>
bool eventually(F cond) {
  for (int i = 0; i < 10000 && !cond(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return cond();
}

void run() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  HeldSync* dev = nullptr;
  auto s = adp::testing::checked_fault_card<HeldSync>(image, kCard, "open", &dev);
  if (!s) return;
  adp::IoContext ctx;
  const size_t size = 4 * adp::kBlockSize;
  const auto k0 = value(0x10, size), a = value(0xa, size), c = value(0xc, size), d = value(0xd, size);
  CHECK(adp::testing::put_one(*s, ctx, "K0", k0).ok(), "the first store (opens the region)");

  Status a_result, c_result;
  std::thread ta([&] {
    adp::testing::t_hold_sync = true;
    adp::IoContext ctx;
    a_result = adp::testing::put_one(*s, ctx, "A", a);
  });
  dev->wait_held();                // A's record written, its sync not yet called
  dev->hold_write(dev->writes());  // C's record
  std::thread tc([&] {
    adp::IoContext ctx;
    c_result = adp::testing::put_one(*s, ctx, "C", c);
  });
  CHECK(eventually([&] { return dev->write_held(); }), "C's record's write was not reached");

  dev->lose_failed_sync_writes();
  dev->fail_sync(dev->syncs());  // the next sync run (none failed yet: runs and successes are one count)
  const Status removed = s->remove(ctx, "K0");
  CHECK(!removed.ok(), "the delete whose sync failed was acknowledged");

  dev->release_held_write(false);  // C's record lands after the failed sync began: it did not lose it
  tc.join();
  dev->release();
  ta.join();
  const Status d_result = adp::testing::put_one(*s, ctx, "D", d);

  CHECK(!a_result.ok(), "A, whose record a failed sync lost, was acknowledged (answered by a later sync)");
  CHECK(!c_result.ok(), "C, behind A's lost record in its region, was acknowledged");
  CHECK(d_result.ok(), "D, stored after the failed sync, failed: %s", d_result.message().c_str());

  dev->power_cut();
  s.reset();
  auto r = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!r) return;
  struct Stored {
    const char* key;
    const std::vector<uint8_t>* bytes;
    const Status* result;
  };
  for (const Stored& st : {Stored{"A", &a, &a_result}, Stored{"C", &c, &c_result}, Stored{"D", &d, &d_result}}) {
    const auto back = adp::testing::read_object(*r, st.key);
    if (st.result->ok()) CHECK(back && *back == *st.bytes, "%s was acknowledged and is lost after the reopen", st.key);
    std::printf("lost_sync_commit_test: %s %s, %s after the reopen\n", st.key,
                st.result->ok() ? "acknowledged" : "failed", back ? "back" : "absent");
  }
}

}  // namespace

int main() {
  run();
  return adp::testing::finish("lost_sync_commit_test");
}
