// SPDX-License-Identifier: Apache-2.0
// A std::bad_alloc out of CardStore::put_each's commit, after some of its items were indexed, in the embedded
// backend's store of several slices with one sync (EmbeddedSession::put_slices, its put_group; review36): until
// debt37 every item of the put that threw was reported failed "out of memory", though the items its commit had
// indexed were on the card and visible (a key a store says failed, yet loads). Now each item's result is its own: Ok
// where it was indexed, failed where it was not.
//
// The failure is injected by this program's operator new (a fault hook of the test build, as
// thread_alloc_test.cc's): the guard of the slice taken late (the second put, written before the first's sync, which
// it makes for both: CardStore::SyncShare) is asked once that sync is done, just before that put's commit; it arms the
// K-th allocation on this thread from then on to throw. K from 0 up, until none throws: the allocation that throws
// moves through the second put's commit (each item's room in the index, its regions' key lists, a tombstone's key),
// then the first put's (whose std::bad_alloc leaves put_slices: its caller, the connector's worker, ends the process
// there, card_store_unwound, as before). For every K, every item of both puts: reported Ok if and only if its key is
// on the card (exists), and its bytes load back. At least one K must fail the late slice part-way (some items
// indexed, some not) and one the first put part-way. An exception out of either put's put_each (a card store
// operation: card_store_unwound) leaves put_slices (review37a: the late slice's was taken by its catch, the run went
// on); the store is used on here only to check the items, as no caller of it would.
// A second sweep (review37b) arms the K-th allocation from put_slices' start: every allocation of both puts, their
// item loops too, with the same check. An item whose store a std::bad_alloc cut short before its write (its
// reservation's room among the put's pins) was reported Ok though not on the card: put_each set its result to its
// key check's Ok before storing it, and put_group handed that out. At least one K must leave put_slices with an item
// not stored.
//
//   put_slices_memory_test
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "alloc_fault.h"
#include "check.h"
#include "connector/backend.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"
#include "transport/embedded_backend.h"

using adp::testing::fail_after;

// This program's operator new (alloc_fault.h): fail_after only.
bool adp::testing::alloc_fault_due() { return false; }

namespace {

using adp::BackendSession;
using adp::testing::check;

// A slice of n keys of 8 KiB, named by tag.
struct Slice {
  Slice(const std::string& tag, int n) {
    for (int i = 0; i < n; i++) {
      keys.push_back("m@00000000@0@" + tag + "-" + std::to_string(i));
      values.push_back(adp::testing::pattern(8192, static_cast<uint8_t>(i + 1)));
    }
    for (int i = 0; i < n; i++) items.push_back({keys[i], values[i].data(), values[i].size()});
    // Not a result any path gives: a result never set reads as this.
    results.assign(n, adp::Status::IoError("never reported"));
  }
  // Ok and on the card alike, each item; how many are Ok.
  int check_truthful(adp::CardStore& s, const std::string& what) {
    int ok = 0;
    for (size_t i = 0; i < keys.size(); i++) {
      const bool visible = s.exists(keys[i]);
      ok += results[i].ok();
      check(results[i].ok() == visible, what + ": " + keys[i] + " reported " +
                                            (results[i].ok() ? "Ok" : "'" + results[i].message() + "'") + ", " +
                                            (visible ? "visible" : "not visible"));
      if (visible) check(adp::testing::read_object(s, keys[i]) == values[i], what + ": " + keys[i] + "'s bytes");
    }
    return ok;
  }
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> values;
  std::vector<adp::PutItem> items;
  std::vector<adp::Status> results;
};

}  // namespace

int main() {
  // 8 regions of 4 MiB.
  auto image = std::make_shared<adp::testing::FaultImage>(adp::testing::card_bytes(8, 4ull << 20));
  std::shared_ptr<adp::CardStore> store =
      adp::testing::checked_fault_card(image, adp::testing::card_options(4ull << 20), "open");
  if (!store) return adp::testing::finish("put_slices_memory_test");
  adp::EmbeddedBackend backend(store);
  auto session = backend.new_session();
  check(session->put_slices_bytes() > 0, "a durable embedded card takes slices together");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  const adp::GuardedReadFn wanted = [](const std::function<void()>& read) { return read(), true; };
  int late_part_way = 0, first_part_way = 0, escaped = 0, k = 0;
  for (; k < 400; k++) {
    const std::string tag = std::to_string(k);
    Slice first("first-" + tag, 3), late("late-" + tag, 3);
    // The late slice's guard, asked once the shared sync is done, before the second put's commit: arms the
    // injection.
    const adp::GuardedReadFn arm = [&](const std::function<void()>& read) {
      read();
      fail_after = k;
      return true;
    };
    BackendSession::PutSlice one{first.items.data(), first.items.size(), first.results.data(), deadline, &wanted};
    BackendSession::PutSlice more_slice{late.items.data(), late.items.size(), late.results.data(), deadline, &arm};
    const BackendSession::MoreSlicesFn more = [&](const BackendSession::PutSlice** out) -> size_t {
      *out = &more_slice;
      return 1;
    };
    bool threw = false;
    const bool unwound_before = adp::card_store_unwound();
    try {
      session->put_slices(&one, 1, &more);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    // An exception out of a card store operation (the late slice's put_each) marks the store unwound: its shared
    // state may be half made, and no caller goes on past it (card_store.h; the connector's worker ends the process
    // on it, fail_slices). put_slices must pass it on, not return as if the run went well (review37a: the late
    // slice's catch took it, the first put then synced and committed on that store, the process went on marked
    // unwound, and the next exception of any worker ended it).
    if (!unwound_before && adp::card_store_unwound())
      check(threw, "allocation " + tag + ": an exception left the late slice's store operation (card_store_unwound) " +
                       "and put_slices returned as if the run went well");
    const bool injected = fail_after == -1;
    fail_after = -1;
    escaped += threw;
    const std::string what = "allocation " + tag + " after the late slice's guard";
    const int late_ok = late.check_truthful(*store, what + ", the late slice");
    const int first_ok = first.check_truthful(*store, what + ", the first slice");
    std::printf("allocation %d: %s; late slice %d of 3 Ok, first slice %d of 3 Ok%s\n", k,
                injected ? "thrown" : "none thrown (fewer made)", late_ok, first_ok,
                threw ? ", the std::bad_alloc left put_slices" : "");
    late_part_way += injected && late_ok > 0 && late_ok < 3;
    first_part_way += threw && first_ok > 0 && first_ok < 3;
    if (!injected) break;  // put_slices made fewer allocations than k: every point gone over
  }
  std::printf("put_slices_memory_test: %d points, the late slice failed part-way at %d, the first at %d, %d escaped\n",
              k, late_part_way, first_part_way, escaped);
  check(k > 0 && k < 400, "the sweep ended with a put that made fewer allocations than k: " + std::to_string(k));
  check(late_part_way > 0, "no allocation failed the late slice's commit part-way");
  check(first_part_way > 0, "no allocation failed the first slice's commit part-way");
  // From put_slices' start (review37b): every allocation of both puts, their item loops too. An item whose store
  // was cut short by it (before its write: its reservation's room among the put's pins) was left reported Ok (its key
  // checked, the result set to that check's Ok before the store was made), though not on the card.
  int cut_short = 0;
  for (k = 0; k < 400; k++) {
    const std::string tag = "s" + std::to_string(k);
    Slice first("first-" + tag, 3), late("late-" + tag, 3);
    BackendSession::PutSlice one{first.items.data(), first.items.size(), first.results.data(), deadline, &wanted};
    BackendSession::PutSlice more_slice{late.items.data(), late.items.size(), late.results.data(), deadline, &wanted};
    const BackendSession::MoreSlicesFn more = [&](const BackendSession::PutSlice** out) -> size_t {
      *out = &more_slice;
      return 1;
    };
    bool threw = false;
    fail_after = k;
    try {
      session->put_slices(&one, 1, &more);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    const bool injected = fail_after == -1;
    fail_after = -1;
    const std::string what = "allocation " + std::to_string(k) + " from put_slices' start";
    const int late_ok = late.check_truthful(*store, what + ", the late slice");
    const int first_ok = first.check_truthful(*store, what + ", the first slice");
    cut_short += threw && first_ok + late_ok < 6;
    if (!injected) break;
  }
  std::printf(
      "put_slices_memory_test: %d points from put_slices' start, %d with the std::bad_alloc out of it and an "
      "item not stored\n",
      k, cut_short);
  check(k > 0 && k < 400,
        "the sweep from the start ended with a put that made fewer allocations than k: " + std::to_string(k));
  check(cut_short > 0, "no allocation from put_slices' start left it with an item not stored");
  // The store goes on: a put after them all.
  Slice after("after", 2);
  BackendSession::PutSlice last{after.items.data(), after.items.size(), after.results.data(), deadline, &wanted};
  session->put_slices(&last, 1, nullptr);
  check(after.check_truthful(*store, "the put after") == 2, "the put after the injected failures stored");
  session.reset();
  store.reset();
  return adp::testing::finish("put_slices_memory_test");
}
