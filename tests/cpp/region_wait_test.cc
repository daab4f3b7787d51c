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
//   - once the loads let go of their regions, a store evicts one and goes on;
//   - a put larger than the card does not wait for the regions it holds pinned itself (its earlier objects', until
//     its commit: no one else's unpin frees them), even where a load pins one of them too; it still waits where a
//     region is pinned by a load alone, and goes on once the load lets go (session 35);
//   - region_waits counts the stores that waited: a put's objects after the one whose wait ran out are refused at
//     once, uncounted, where a load still pins a region (session 36; each was counted before, without waiting);
//   - a put that shares an earlier put's sync (CardStore::SyncShare) does not wait for the regions that earlier put,
//     its caller, holds pinned (session 36), nor queue behind another thread's store that waits for them: it fails
//     NoSpace at once, the first put's commit lets go of its regions, and that store evicts one (review36; both
//     stuck for 5 s before, and that store failed).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
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
// open a region finds every one pinned, by the put itself: it fails at once (NoSpace), and so do the items after it.
// Until review34b each of those items waited its own 5 s for pins that only the put's end lets go of (a put 3 items
// past the card took 15 s, k items past it 5k s, its caller's thread held: stall34's note (b)); until session 35 the
// first of them still did (5 s, one region wait).
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
  check(s->stats().region_waits == 0, "the put waited " + std::to_string(took) + " s for a region (region_waits " +
                                          std::to_string(s->stats().region_waits) +
                                          "): every region was pinned by the put's own objects");
  // Its objects are there, and a store after it evicts a region and goes on.
  auto got = adp::testing::read_object(*s, ctx, key(0));
  check(got && *got == kValue, "the put's first object reads back");
  adp::Status st = adp::testing::put_one(*s, ctx, key(total), kValue);
  check(st.ok(), "a store after the put (" + st.message() + ")");
}

// When the held load of put_beside_a_load lets go: once the put has returned, or once the put waits for a region.
enum class LetGo { kAfterThePut, kWhenThePutWaits };

// What put_beside_a_load saw: the put's results, the region waits counted, and whether the load's object was still
// there after the put (not evicted).
struct PutBesideALoad {
  std::vector<adp::Status> results;
  uint64_t region_waits = 0;
  bool loaded_kept = false;
  int stored = 0, refused = 0;
};

// A put of n + 3 objects (n: what the card holds) into a full card, on a thread of its own, while a load of
// key(loaded), its read held, pins that object's regions; the load lets go as `when` says.
PutBesideALoad put_beside_a_load(int loaded, LetGo when) {
  const int n = stores_before_first_eviction();
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  HeldReads* dev;
  auto s = adp::testing::checked_fault_card<HeldReads>(image, kCard, "open", &dev);
  PutBesideALoad out;
  if (!s) return out;
  adp::IoContext ctx;
  for (int i = 0; i < n; i++) check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), "fill");
  std::thread load([&] {
    adp::testing::t_hold_read = true;
    auto got = adp::testing::read_object(*s, key(loaded));
    check(got && *got == kValue, "the held load reads its object");
  });
  dev->wait_held(1);
  const int total = n + 3;
  std::vector<std::string> keys;
  for (int i = 0; i < total; i++) keys.push_back(key(1000 + i));
  std::vector<adp::PutItem> items;
  for (int i = 0; i < total; i++) items.push_back({keys[i], kValue.data(), kValue.size()});
  out.results.resize(total);
  std::thread put([&] {
    adp::IoContext c;
    s->put(c, items.data(), items.size(), out.results.data(), [] { return true; });
  });
  if (when == LetGo::kAfterThePut) {
    put.join();
  } else {
    wait_for_region_waits(*s, 1);
  }
  dev->release();
  load.join();
  if (put.joinable()) put.join();
  out.region_waits = s->stats().region_waits;
  out.loaded_kept = adp::testing::read_object(*s, ctx, key(loaded)).has_value();
  for (const adp::Status& r : out.results) {
    out.stored += r.ok();
    out.refused += r.code() == adp::Status::Code::kNoSpace;
  }
  check(out.stored + out.refused == total, "each of the put's objects stored or refused NoSpace");
  return out;
}

// The held load's object lies in the card's frontier region, whose tail the put's first object takes: that region
// is pinned by the put from then on, and every other by the put's later objects. The objects past the card fail at
// once (no region wait): the load letting go would free nothing (the put's own pin stays). Until session 35 the put
// waited 5 s for it.
void put_past_a_load_in_its_own_region() {
  const int n = stores_before_first_eviction();
  // The last object stored before the put lies in the frontier region (with a tail of the region left after it).
  PutBesideALoad r = put_beside_a_load(n - 1, LetGo::kAfterThePut);
  std::printf("put_past_a_load_in_its_own_region: %d stored, %d refused, %llu region waits\n", r.stored, r.refused,
              static_cast<unsigned long long>(r.region_waits));
  check(r.stored > 0 && r.refused > 0, "the put stored some objects and was refused the rest");
  check(r.region_waits == 0, "the put waited for a region (" + std::to_string(r.region_waits) +
                                 " region waits) that a load and the put itself held pinned");
  check(r.loaded_kept, "the load's object, in the put's first region, is still there");
}

// The held load's object lies in the least recently used region, which no object of the put is in: the put evicts
// every other region, then waits for that one (another's pin), and once the load lets go, evicts it and goes on: a
// put that fits once others let go still waits. Its next object past the card fails at once: until session 35 it
// waited 5 s more for the put's own regions (2 region waits).
void put_waits_for_a_load_elsewhere() {
  PutBesideALoad r = put_beside_a_load(0, LetGo::kWhenThePutWaits);
  std::printf("put_waits_for_a_load_elsewhere: %d stored, %d refused, %llu region waits\n", r.stored, r.refused,
              static_cast<unsigned long long>(r.region_waits));
  check(r.region_waits == 1,
        "the put waited once for the region the load held (" + std::to_string(r.region_waits) + " region waits)");
  check(!r.loaded_kept, "the put evicted the load's region once the load let go");
  check(r.stored > 0 && r.refused > 0, "the put stored some objects and was refused the rest");
}

// The held load's object lies in the least recently used region, as in put_waits_for_a_load_elsewhere, but the load
// holds it until the put has returned: the object that must open a region waits its 5 s for it and is refused
// (NoSpace; one region wait), and the objects after it, told to wait for none (put_each: a deadline of now), are
// refused at once, the load's pin notwithstanding. Only the one that waited is counted: until session 36 each of
// them counted a region wait too (region_waits 12 for a put that waited once) and failed without waiting.
void put_refused_past_a_wait_counts_one() {
  PutBesideALoad r = put_beside_a_load(0, LetGo::kAfterThePut);
  std::printf("put_refused_past_a_wait_counts_one: %d stored, %d refused, %llu region waits\n", r.stored, r.refused,
              static_cast<unsigned long long>(r.region_waits));
  check(r.stored > 0 && r.refused >= 2,
        "the put stored some objects and was refused at least two: the one that "
        "waited and one after it that did not");
  check(r.region_waits == 1, "the put waited once, for the region the load held, and was counted " +
                                 std::to_string(r.region_waits) +
                                 " region waits: its later objects, refused at once, were counted as waits");
  check(r.loaded_kept, "the load's object, pinned throughout the put, is still there");
}

// A new card, the keys of a first put of n objects (as many as it holds before its first eviction: every region
// then holds some of them, pinned until that put's commit) and of a late object after them, for a second put that
// shares the first's sync (CardStore::SyncShare).
struct SharedSyncPuts {
  int n = stores_before_first_eviction();
  std::shared_ptr<FaultImage> image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  std::unique_ptr<adp::CardStore> s = adp::testing::checked_fault_card(image, kCard, "open");
  std::vector<std::string> keys;
  std::vector<adp::PutItem> items;
  adp::IoContext ctx, second_ctx;
  std::vector<adp::Status> results;
  adp::Status late_result;
  SharedSyncPuts() {
    for (int i = 0; i <= n; i++) keys.push_back(key(i));
    for (int i = 0; i < n; i++) items.push_back({keys[i], kValue.data(), kValue.size()});
  }
  // The first put, `before_sync` given; returns how many of its objects it stored.
  int first_put(const std::function<std::optional<adp::Status>(uint64_t, std::span<const uint32_t>)>& before_sync) {
    adp::CardStore::SyncShare share;
    share.before_sync = before_sync;
    results.assign(n, adp::Status());
    s->put_each(ctx, items.data(), items.size(), results.data(), [](size_t) { return true; }, &share);
    int stored = 0;
    for (const adp::Status& r : results) stored += r.ok();
    return stored;
  }
  // The second put, of the late object, sharing the first's sync (before_sync's arguments): its sync's result.
  std::optional<adp::Status> second_put(uint64_t since, std::span<const uint32_t> pins) {
    adp::CardStore::SyncShare second;
    second.since = since;
    second.pins = pins;
    const adp::PutItem item{keys[n], kValue.data(), kValue.size()};
    s->put_each(second_ctx, &item, 1, &late_result, [](size_t) { return true; }, &second);
    return second.result;
  }
};

// Two puts of one sync (CardStore::SyncShare, a connector worker's store slices queued while its run was written:
// EmbeddedSession::put_slices): the first fills the card, and its before_sync runs the second, whose object must open
// a region where every one is held by the first's objects (pinned until the first's commit, after the second
// returns). It fails at once (NoSpace), with no region wait, and the first's objects are stored with the second's
// sync; a store after them evicts a region (the first's pins let go once, at its commit). Until session 36 the
// second put waited its 5 s for the first's pins (one region wait), its caller's whole run held.
void second_put_of_a_shared_sync() {
  SharedSyncPuts p;
  if (!p.s) return;
  const int n = p.n;
  auto& s = p.s;
  double late_took = -1;
  const int stored = p.first_put([&](uint64_t since, std::span<const uint32_t> pins) {
    const auto start = Clock::now();
    std::optional<adp::Status> r = p.second_put(since, pins);
    late_took = std::chrono::duration<double>(Clock::now() - start).count();
    return r;
  });
  const adp::Status& late_result = p.late_result;
  adp::IoContext& ctx = p.ctx;
  check(stored == n, "the first put stored " + std::to_string(stored) + " of its " + std::to_string(n) + " objects");
  check(late_took >= 0, "the first put ran the second before its sync");
  check(late_result.code() == adp::Status::Code::kNoSpace,
        "the second put, every region held by the first's objects: NoSpace (" + late_result.message() + ")");
  check(late_took < 2.5, "the second put took " + std::to_string(late_took) +
                             " s: it waited for regions that the first put, its caller, held pinned");
  check(s->stats().region_waits == 0,
        "the second put waited for a region (region_waits " + std::to_string(s->stats().region_waits) + ")");
  auto got = adp::testing::read_object(*s, ctx, key(0));
  check(got && *got == kValue, "the first put's first object reads back");
  adp::Status st = adp::testing::put_one(*s, ctx, key(n + 1), kValue);
  check(st.ok(), "a store after the two puts (" + st.message() + ")");
  check(s->stats().evicted_regions >= 1, "it evicted a region");
}

// Another thread's store that must open a region while the first put of a shared sync holds every region pinned
// waits for them (they are not its own), holding frontier_mu_; the second put, run by the first before its sync
// (before it lets go of its pins), queues for frontier_mu_ behind it. Neither can go on until the other's 5 s run
// out: the other thread's store fails NoSpace after 5 s, where without the shared sync the first put's commit lets
// go of its regions at once and it evicts one (review36).
void store_waiting_beside_a_shared_sync() {
  SharedSyncPuts p;
  if (!p.s) return;
  const int n = p.n;
  std::unique_ptr<TimedStore> other;
  const auto start = Clock::now();
  const int stored = p.first_put([&](uint64_t since, std::span<const uint32_t> pins) {
    // The other thread's store, waiting for a region (every one held by this put's objects).
    other = std::make_unique<TimedStore>(*p.s, key(n + 1), kValue);
    wait_for_region_waits(*p.s, 1);
    return p.second_put(since, pins);
  });
  const double first_took = std::chrono::duration<double>(Clock::now() - start).count();
  check(other != nullptr, "the first put ran the second before its sync");
  if (!other) return;
  other->thread.join();
  const double other_took = std::chrono::duration<double>(other->done - start).count();
  const adp::Status& late_result = p.late_result;
  check(stored == n, "the first put stored " + std::to_string(stored) + " of its " + std::to_string(n) + " objects");
  check(first_took < 2.5, "the first put took " + std::to_string(first_took) +
                              " s: its second put queued behind a store that waited for the first's own pins");
  check(late_result.code() == adp::Status::Code::kNoSpace,
        "the second put, a store ahead of it waiting for a region: NoSpace (" + late_result.message() + ")");
  check(other->result.ok(), "the other thread's store, once the first put let go of its regions: " +
                                other->result.message() + " after " + std::to_string(other_took) + " s");
}

}  // namespace

int main() {
  every_region_pinned();
  put_larger_than_the_card();
  put_past_a_load_in_its_own_region();
  put_waits_for_a_load_elsewhere();
  put_refused_past_a_wait_counts_one();
  second_put_of_a_shared_sync();
  store_waiting_beside_a_shared_sync();
  return adp::testing::finish("region_wait_test");
}
