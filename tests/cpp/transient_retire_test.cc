// SPDX-License-Identifier: Apache-2.0
// A region whose eviction's header could not be made durable for a reason that passes (review33d): a failed sync
// (FaultDevice::fail_sync: the writes stay unsynced, a later sync may make them durable, as after a failed
// fdatasync) says nothing about the region's header block, yet CardStore::advance_frontier retires the region
// when the next one opens, as for a bad block, and the WARNING says its header block "refused a write". The card
// then holds one region less until it is reopened, for each such failure (review33a F5's retirement is meant for
// a block that refuses writes). Two cards given the same stores, one with the eviction's header sync failed once,
// must hold as many objects once both have evicted round the card again.
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

using namespace adp::testing::small_card;  // NOLINT: kRegion, kRegions, kCard, kValue, key

// Objects held after n + extra stores of kValue, the sync of the first eviction's header failed once if `fail`.
uint64_t objects_after(int n, int extra, bool fail) {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  FaultDevice* dev;
  auto s = adp::testing::checked_fault_card(image, kCard, "open", &dev);
  if (!s) return 0;
  adp::IoContext ctx;
  for (int i = 0; i < n; i++) check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), "fill");
  check(s->stats().evicted_objects == 0, "nothing evicted yet");
  // The next sync: the first eviction's region header (advance_frontier syncs it before anything is written under
  // its epoch).
  if (fail) dev->fail_sync(dev->syncs_run());
  int failures = 0;  // the store whose eviction met the failed sync may fail with it (its writes began before it)
  for (int i = n; i < n + extra; i++) failures += !adp::testing::put_one(*s, ctx, key(i), kValue).ok();
  check(failures <= (fail ? 1 : 0), std::to_string(failures) + " stores failed");
  return s->stats().objects;
}

}  // namespace

int main() {
  const int n = adp::testing::stores_before_first_eviction(kRegions, kCard, kValue, key);
  if (n < 0) return adp::testing::finish("transient_retire_test");
  const int extra = 4 * n;  // round the card several times
  const uint64_t clean = objects_after(n, extra, false), failed = objects_after(n, extra, true);
  check(failed == clean, "objects held after a failed sync of an eviction's header: " + std::to_string(failed) +
                             ", against " + std::to_string(clean) +
                             " on the same stores without it (a region retired until the reopen)");
  return adp::testing::finish("transient_retire_test");
}
