// SPDX-License-Identifier: Apache-2.0
// A store that must open a region on a full card where no region is free or evictable (every sealed region pinned
// by a load in flight) waits for one (CardStore::advance_frontier, unpinned_) up to 5 s, holding frontier_mu_
// (reserve). What that blocks, and what it must not (brief stall34, L1):
//   - loads and deletes never take frontier_mu_: a load and a delete complete while the store waits;
//   - a store of the smallest object waits too: the frontier is full whenever a region is opened (a record that
//     does not fit takes the frontier's tail and continues), so it needs a region as well;
//   - that store's wait is not stacked behind the first one's: both give up together (NoSpace), 5 s from their
//     start. Until session 34 each reservation's 5 s began when it took frontier_mu_: a store queued behind one that
//     waited in vain failed 5 s after it ("the second store gave up ~5 s after the first"), the k-th 5k s after;
//   - once the loads let go of their regions, a store evicts one and goes on.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "held_sync.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::testing::check;
using adp::testing::FaultImage;
using adp::testing::HeldReads;
using Clock = std::chrono::steady_clock;

using namespace adp::testing::small_card;  // NOLINT: kRegion, kRegions, kCard, kValue, key

// The number of stores of kValue into a new card before the store that makes its first eviction.
int stores_before_first_eviction() { return adp::testing::stores_before_first_eviction(kRegions, kCard, kValue, key); }

// A store on a thread of its own: its result, and when it returned.
struct TimedStore {
  adp::Status result;
  Clock::time_point done;
  std::atomic<bool> finished{false};
  std::thread thread;
  TimedStore(adp::CardStore& s, std::string k, const std::vector<uint8_t>& value) {
    thread = std::thread([this, &s, k = std::move(k), &value] {
      adp::IoContext c;
      result = adp::testing::put_one(s, c, k, value);
      done = Clock::now();
      finished = true;
    });
  }
};

void wait_for_region_waits(adp::CardStore& s, uint64_t n) {
  while (s.stats().region_waits < n) std::this_thread::yield();
}

void every_region_pinned() {
  const int n = stores_before_first_eviction();
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  HeldReads* dev;
  auto s = adp::testing::checked_fault_card<HeldReads>(image, kCard, "open", &dev);
  if (!s) return;
  adp::IoContext ctx;
  for (int i = 0; i < n; i++) check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), "fill");
  check(s->stats().free_regions == 0 && s->stats().evicted_objects == 0, "the card is full, nothing evicted");
  // A load in flight in every region (the frontier's too): none is evictable.
  std::vector<std::thread> loads;
  std::vector<int> pinned_keys;
  for (uint64_t r = 0; r < kRegions; r++)
    for (int i = 0; i < n; i++) {
      const uint64_t at = adp::testing::header_block(*image, key(i));
      if (at < adp::kDataOffset || (at - adp::kDataOffset) / kRegion != r) continue;
      pinned_keys.push_back(i);
      break;
    }
  check(pinned_keys.size() == kRegions, "every region holds an object's header");
  std::atomic<int> loaded{0};
  for (int i : pinned_keys)
    loads.emplace_back([&, i] {
      adp::testing::t_hold_read = true;
      auto got = adp::testing::read_object(*s, key(i));
      loaded += got && *got == kValue;
    });
  dev->wait_held(static_cast<int>(pinned_keys.size()));

  // The store that makes the first eviction: it must open a region, and none is free or evictable.
  TimedStore first(*s, key(n), kValue);
  wait_for_region_waits(*s, 1);
  // While it waits: a load and a delete of keys in pinned regions complete.
  auto got = adp::testing::read_object(*s, ctx, key(pinned_keys[0]));
  check(got && *got == kValue, "a load while a store waits for a region");
  int victim = pinned_keys[0] == 0 ? 1 : 0;
  adp::Status del = s->remove(ctx, key(victim));
  check(del.ok(), "a delete while a store waits for a region (" + del.message() + ")");
  check(!first.finished, "the first store still waits (the load and the delete did not wait for it)");
  // The smallest store needs a region too (the frontier is full): it waits, and not longer than the first.
  const std::vector<uint8_t> small(1, 9);
  TimedStore second(*s, key(n + 1), small);
  first.thread.join();
  second.thread.join();
  check(first.result.code() == adp::Status::Code::kNoSpace,
        "the first store, every region pinned: NoSpace (" + first.result.message() + ")");
  check(second.result.code() == adp::Status::Code::kNoSpace,
        "the second store, every region pinned: NoSpace (" + second.result.message() + ")");
  const double apart = std::chrono::duration<double>(second.done - first.done).count();
  check(apart < 2.5, "the second store gave up " + std::to_string(apart) +
                         " s after the first (its wait stacked behind the first's: it started while the first "
                         "waited, and its 5 s began when the first gave up)");
  dev->release();
  for (auto& t : loads) t.join();
  check(loaded == static_cast<int>(pinned_keys.size()), "the held loads read their objects");
  // The loads let go: a store evicts a region and goes on.
  adp::Status st = adp::testing::put_one(*s, ctx, key(n + 2), kValue);
  check(st.ok(), "a store once the loads let go of their regions (" + st.message() + ")");
  check(s->stats().evicted_regions >= 1, "it evicted a region");
}

// One put larger than the card: its earlier items keep their regions pinned until its commit, so the item that must
// open a region finds every one pinned (by the put itself) and waits its 5 s in vain. The items after it look for a
// region and wait for none: the put returns ~5 s after that item's wait began. Until review34b each later item
// waited its own 5 s (the pins mostly the put's own, let go only at its end): a put 3 items past the card took 15 s,
// k items past it 5k s, its caller's thread held (stall34's note (b)).
void put_larger_than_the_card() {
  const int n = stores_before_first_eviction();
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  auto s = adp::testing::checked_fault_card(image, kCard, "open");
  if (!s) return;
  adp::IoContext ctx;
  const int total = n + 3;
  std::vector<std::string> keys;
  for (int i = 0; i < total; i++) keys.push_back(key(i));
  std::vector<adp::PutItem> items;
  for (int i = 0; i < total; i++) items.push_back({keys[i], kValue.data(), kValue.size()});
  std::vector<adp::Status> results(total);
  const auto start = Clock::now();
  s->put(ctx, items.data(), items.size(), results.data(), [] { return true; });
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  int stored = 0, refused = 0;
  for (const adp::Status& r : results) {
    stored += r.ok();
    refused += r.code() == adp::Status::Code::kNoSpace;
  }
  check(stored == n && refused == 3, "a put of " + std::to_string(total) + " objects into a card that holds " +
                                         std::to_string(n) + ": " + std::to_string(stored) + " stored, " +
                                         std::to_string(refused) + " refused NoSpace");
  check(took < 9.0, "the put took " + std::to_string(took) +
                        " s: each object past the card waited its own 5 s for regions the put itself held pinned");
  // Its objects are there, and a store after it evicts a region and goes on.
  auto got = adp::testing::read_object(*s, ctx, key(0));
  check(got && *got == kValue, "the put's first object reads back");
  adp::Status st = adp::testing::put_one(*s, ctx, key(total), kValue);
  check(st.ok(), "a store after the put (" + st.message() + ")");
}

}  // namespace

int main() {
  every_region_pinned();
  put_larger_than_the_card();
  return adp::testing::finish("region_wait_test");
}
