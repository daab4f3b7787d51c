// SPDX-License-Identifier: Apache-2.0
// An eviction drops the victim region's objects from the index (under the lock) before its new region header,
// the only thing that hides them on the card, is written and synced (CardStore::advance_frontier, outside the
// lock). A key evicted so is not in the index, so a delete of it is NotFound with nothing written (remove()).
// Where that header never lands, the victim's records still walk under the old epoch at the next open, and the
// deleted key is back (DESIGN.md: "A deleted key ... does not come back after a restart, a crash or a power cut
// at any write"; docs/card_format.md says the same for a region whose header was not walked, session 23):
//   - failed: the eviction's header write fails (a bad block; regions_.fail_open puts the region on the free
//     list, its old header and records untouched on the card); a delete of an evicted key: NotFound; reopened;
//   - crash: the eviction's header write held in flight, a delete of an evicted key (NotFound at once), then the
//     process dies before that write lands.
// Both fail on the code of session 32 (review33a F1): the deleted key loads after the reopen.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::testing::check;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;

constexpr uint64_t kRegion = 1u << 20;
constexpr uint64_t kRegions = 8;
const adp::CardOptions kCard = adp::testing::card_options(kRegion);
const std::vector<uint8_t> kValue(200000, 7);

std::string key(int i) { return "model@0@0@" + std::to_string(i); }

// The number of stores of kValue into a new card before the store that makes its first eviction (the same on
// every new card: one writer, no reads).
int stores_before_first_eviction() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  auto s = adp::testing::checked_fault_card(image, kCard, "probe open");
  if (!s) return -1;
  adp::IoContext ctx;
  for (int i = 0;; i++) {
    check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), "probe store");
    if (s->stats().evicted_objects) return i;
  }
}

void evicted_key_deleted(bool crash) {
  const int n = stores_before_first_eviction();
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  {
    FaultDevice* dev;
    auto s = adp::testing::checked_fault_card(image, kCard, "open", &dev);
    if (!s) return;
    adp::IoContext ctx;
    for (int i = 0; i < n; i++) check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), "fill");
    check(s->stats().free_regions == 0 && s->stats().evicted_objects == 0, "the card is full, nothing evicted");
    // The victim is the least recently used region: region 0, which holds key 0.
    const uint64_t victim = adp::kDataOffset;
    check(adp::testing::header_block(*image, key(0)) < victim + kRegion, "key 0 is in region 0");
    if (!crash) {
      dev->fail_writes(victim, victim + adp::kBlockSize);
      adp::Status st = adp::testing::put_one(*s, ctx, key(n), kValue);
      check(!st.ok(), "the store whose eviction's header write failed fails");
      check(!s->exists(key(0)), "key 0 was evicted");
      adp::Status del = s->remove(ctx, key(0));
      check(del.is_not_found(), "delete of the evicted key 0: NotFound (" + del.message() + ")");
    } else {
      dev->keep_all_unsynced_at_cut();  // a process crash: what was written stays
      dev->hold_write(dev->writes());   // the next write: the eviction's region header
      adp::Status st;
      std::thread store([&] {
        adp::IoContext c;
        st = adp::testing::put_one(*s, c, key(n), kValue);
      });
      while (!dev->write_held()) std::this_thread::yield();
      check(!s->exists(key(0)), "key 0 was evicted (its region's header write in flight)");
      adp::Status del = s->remove(ctx, key(0));
      check(del.is_not_found(), "delete of the evicted key 0: NotFound (" + del.message() + ")");
      dev->power_cut();  // the process dies: the held header write never lands
      store.join();
    }
  }
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  std::string what = crash ? "crash" : "failed";
  check(!adp::testing::read_object(*s, key(0)),
        what + ": key 0, deleted (NotFound: evicted) before the reopen, is back after it");
}

}  // namespace

int main() {
  evicted_key_deleted(false);
  evicted_key_deleted(true);
  return adp::testing::finish("evict_header_test");
}
