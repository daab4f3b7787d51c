// SPDX-License-Identifier: Apache-2.0
// A tombstone written into a free region must not land after the region is handed out again.
// An eviction whose new region header did not land (its write refused, or its sync failed) puts the region back
// under its old epoch, every object the eviction dropped marked deleted: tombstones pending there, written by the
// next store or delete (retry_pending), over the old records' header blocks. Such a region may be on the free list
// meanwhile: when no other region opened (every try's header write failed), or, a failed sync being no bad block,
// once another one opened (review33d F2). retry_pending checks the region's epoch and pins it under the lock, then
// writes the tombstone outside it; until session 34 a pin did not keep a region off the free list
// (RegionManager::take_free), so a store meanwhile could take the region, open it under a new epoch and write a
// record where the old one was, and the tombstone, landing late, overwrote that record's header block: the next load
// of it met a header that did not check out (a checksum failure, served as a miss, the object dropped) on a card
// that had lost no write. This is card_crash_mt_test's one failure in 3,456 runs of session 33's fresh-clone CI
// (seed=4 point=63: "failed sync, then a power cut, 4 threads: 1 checksum failures counted during the run").
// Here the tombstone's write is held (FaultDevice::hold_write) while another thread stores, so the interleaving is
// deterministic:
//   - refused: the three regions an eviction tries all refuse their header write (no region opens); they go to
//     the free list with their tombstones pending; a store's retry_pending takes them, its first tombstone write
//     (over the first record of the region handed out next) held; another store takes that region and writes
//     its record there; the tombstone lands; that record must still load;
//   - sync: the sync of an eviction's header fails; the region goes back to the free list once another opens
//     (review33d F2: a failed sync is no bad block); the same race, the region taken by a store that fills the
//     frontier region.
// Both must load every object stored with no checksum failure counted.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::Status;
using adp::testing::check;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;

using namespace adp::testing::small_card;  // NOLINT: kRegion, kRegions, kCard, kValue, key

// A fault device whose region header blocks refuse writes while refuse_headers is set (a transient failure: the
// block takes writes again once it is cleared; FaultDevice::fail_writes is for good).
class HeaderRefusingDevice : public FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  Status writev(uint64_t offset, const iovec* iov, int count) const override {
    uint64_t n = 0;
    for (int i = 0; i < count; i++) n += iov[i].iov_len;
    if (refuse_headers && offset >= adp::kDataOffset && (offset - adp::kDataOffset) % kRegion == 0 &&
        n == adp::kBlockSize)
      return adp::Status::IoError("write of a region header refused: injected");
    return FaultDevice::writev(offset, iov, count);
  }
  std::atomic<bool> refuse_headers{false};
};

int stores_before_first_eviction() { return adp::testing::stores_before_first_eviction(kRegions, kCard, kValue, key); }

void tombstone_into_a_free_region(bool sync) {
  const std::string what = sync ? "sync" : "refused";
  const int n = stores_before_first_eviction();
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  HeaderRefusingDevice* dev;
  auto s = adp::testing::checked_fault_card(image, kCard, "open", &dev);
  if (!s) return;
  adp::IoContext ctx;
  for (int i = 0; i < n; i++) check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), what + ": fill");
  check(s->stats().free_regions == 0 && s->stats().evicted_objects == 0, what + ": the card is full, none evicted");
  int next = n;
  // The eviction that does not land: its region (region 0, the least recently used; more with `refused`) back
  // under its old epoch, on the free list, its objects' tombstones pending.
  if (sync) {
    dev->fail_sync(dev->syncs_run());  // the next sync: the eviction's region header's
  } else {
    dev->refuse_headers = true;
  }
  (void)adp::testing::put_one(*s, ctx, key(next++), kValue);  // failed or not: its record is not checked
  dev->refuse_headers = false;
  check(s->stats().evicted_objects > 0, what + ": the store evicted");
  const uint64_t free_before = s->stats().free_regions;
  check(free_before > 0, what + ": the region whose header did not land is free (" +
                             std::to_string(s->stats().free_regions) + " free regions)");
  // A store's retry_pending takes the tombstones; the first one's write is held.
  dev->hold_write(dev->writes());
  Status held_store;
  std::thread x([&] {
    adp::IoContext c;
    held_store = adp::testing::put_one(*s, c, "model@0@0@x", kValue);
  });
  while (!dev->write_held()) std::this_thread::yield();
  // Stores on this thread until the frontier takes a free region (or 12 stores: it evicts instead).
  std::vector<int> stored;
  for (int k = 0; k < 12; k++) {
    const int i = next++;
    Status st = adp::testing::put_one(*s, ctx, key(i), kValue);
    check(st.ok(), what + ": a store while a tombstone into a free region is held (" + st.message() + ")");
    if (st.ok()) stored.push_back(i);
    if (s->stats().free_regions < free_before) break;
  }
  dev->release_held_write(false);
  x.join();
  check(held_store.ok(), what + ": the store that wrote the pending tombstones (" + held_store.message() + ")");
  for (int i : stored) {
    auto got = adp::testing::read_object(*s, ctx, key(i));
    check(got && *got == kValue, what + ": " + key(i) + ", stored while the tombstone was held, loads");
  }
  check(s->stats().checksum_failures == 0,
        what + ": " + std::to_string(s->stats().checksum_failures) + " checksum failures counted on a card that lost " +
            "no write (a tombstone of the free region's old epoch over a record of its new one)");
}

}  // namespace

int main() {
  tombstone_into_a_free_region(false);
  tombstone_into_a_free_region(true);
  return adp::testing::finish("free_region_tombstone_test");
}
