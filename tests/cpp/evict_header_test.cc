// SPDX-License-Identifier: Apache-2.0
// An eviction drops the victim region's objects from the index (under the lock) before its new region header,
// the only thing that hides them on the card, is written and synced (CardStore::advance_frontier, outside the
// lock). Where that header never lands, the victim's records still walk under the old epoch at the next open.
// DESIGN.md: "A deleted key, or a superseded copy, does not come back after a restart, a crash or a power cut at
// any write"; docs/card_format.md, "Eviction". Until session 33 (review33a F1) a delete of an evicted key was
// NotFound with nothing written, and the key was back after the reopen:
//   - failed: the eviction's header write fails (a bad block). Now the region is put back under its old epoch and
//     retired, each object the eviction dropped marked deleted (its tombstone pending, written by the next store
//     or delete), another region evicted: the store goes on, the delete sticks, and the card's usage after the
//     reopen is what it was before;
//   - crash: the eviction's header write held in flight, a delete of an evicted key, then the process dies before
//     that write lands. Now the delete is refused (Busy: not done) while the header is in flight; before, it was
//     reported done (NotFound) and the key came back;
//   - pending: a superseded copy whose tombstone is pending (its block refuses writes) in the region an eviction
//     is reopening, a delete or store (retry_pending) while that region's header is in flight, then the header
//     write fails. retry_pending took the region for reused and dropped the tombstone, unpinning the newer copy's
//     regions (review33a, retry_pending): the newer copy was evicted and the superseded one was the key's value
//     after the reopen. Now the tombstone is kept until the header lands or the region is put back, and not due
//     meanwhile: the stores while the header is in flight do not scan the pending list (until session 36, once its
//     back-off ran out, every store did: review34b);
//   - stored anew: a store of an evicted key reserved before the eviction commits while the header is in flight
//     (no older copy indexed: no tombstone), then the header write fails. The region put back, the older copy
//     there is marked deleted as a superseded one, its tombstone guarded by the newer copy's
//     region. Without that, once the newer copy's region was evicted the older copy was back after the reopen
//     (shown by leaving the older copy unmarked: "stored anew: key 0's superseded copy is its value");
//   - stored anew, its tombstone failing: the same, the older copy's header block refusing writes too, so that its
//     tombstone stays pending. The guard is what keeps the newer copy: its region is pinned until that tombstone is
//     written, and without the pin the stores after it evicted the newer copy and the older one was the key's value
//     after the reopen (debt39 item 2: s38's check found that the scenario above, whose tombstone is written by the
//     next store, passed with the guard removed; this one fails then: "stored anew, its tombstone failing: key 0's
//     superseded copy is its value").
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
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

using namespace adp::testing::small_card;  // NOLINT: kRegion, kRegions, kCard, kValue, key

// The number of stores of kValue into a new card before the store that makes its first eviction.
int stores_before_first_eviction() { return adp::testing::stores_before_first_eviction(kRegions, kCard, kValue, key); }

// A delete answered Ok or NotFound is done: the key must not load after the reopen.
bool done(const adp::Status& del) { return del.ok() || del.is_not_found(); }

void evicted_key_deleted(bool crash) {
  const int n = stores_before_first_eviction();
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  bool deleted = false;
  uint64_t objects = 0, used = 0;
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
      check(st.ok(),
            "the store whose eviction met the bad header block went on in another region (" + st.message() + ")");
      check(!s->exists(key(0)), "key 0 was evicted");
      // Its delete first writes the tombstones the failed eviction left pending (retry_pending): NotFound.
      adp::Status del = s->remove(ctx, key(0));
      check(del.is_not_found(), "delete of the evicted key 0 (" + del.message() + ")");
      deleted = done(del);
      for (int i = n + 1; i < n + 20; i++)
        check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), "a store after the bad block was met");
      objects = s->stats().objects;
      used = s->stats().used_bytes;
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
      check(del.code() == adp::Status::Code::kBusy,
            "delete of key 0 while its region's new header is in flight: refused (" + del.message() + ")");
      deleted = done(del);
      dev->power_cut();  // the process dies: the held header write never lands
      store.join();
    }
  }
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  std::string what = crash ? "crash" : "failed";
  if (deleted) check(!adp::testing::read_object(*s, key(0)), what + ": key 0, deleted before the reopen, is back");
  if (!crash)
    check(s->stats().objects == objects && s->stats().used_bytes == used,
          "failed: " + std::to_string(objects) + " objects, " + std::to_string(used) + " bytes before the close, " +
              std::to_string(s->stats().objects) + ", " + std::to_string(s->stats().used_bytes) + " after the reopen");
}

void pending_tombstone_in_the_evicted_region() {
  const int n = stores_before_first_eviction();
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  const std::vector<uint8_t> newer(200000, 8);
  {
    FaultDevice* dev;
    auto s = adp::testing::checked_fault_card(image, kCard, "open", &dev);
    if (!s) return;
    adp::IoContext ctx;
    for (int i = 0; i < n; i++) check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), "fill");
    const uint64_t region0 = adp::kDataOffset, older = adp::testing::header_block(*image, key(0));
    check(older < region0 + kRegion, "key 0 is in region 0");
    check(adp::testing::read_object(*s, ctx, key(0)).has_value(), "key 0 loads");  // region 0 not the LRU now
    // Key 0 stored anew (into region 1, evicted for it); its older copy's tombstone fails: pending, the newer
    // copy's region pinned until it is written.
    dev->fail_writes(older, older + adp::kBlockSize);
    check(adp::testing::put_one(*s, ctx, key(0), newer).ok(), "key 0 stored anew");
    // Region 0's header block refuses writes too; the first write of it (its eviction) waits for this thread.
    dev->fail_writes(region0, region0 + adp::kBlockSize);
    std::mutex mu;
    std::condition_variable cv;
    bool in_window = false, go = false;
    dev->observe_writes([&](uint64_t, uint64_t offset, uint64_t) {
      if (offset != region0) return;
      std::unique_lock<std::mutex> l(mu);
      if (in_window) return;
      in_window = true;
      cv.notify_all();
      cv.wait(l, [&] { return go; });
    });
    std::atomic<int> next{n};
    std::thread stores([&] {
      adp::IoContext c;
      for (int k = 0; k < 60; k++) {
        check(adp::testing::put_one(*s, c, key(next++), kValue).ok(), "a store while region 0 is evicted");
        std::lock_guard<std::mutex> l(mu);
        if (in_window) break;
      }
    });
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return in_window; });
    }
    // Region 0 evicted, its new header in flight (the device waits in the observer: this delete does no I/O,
    // key absent). Its retry_pending meets the pending tombstone of key 0's older copy in region 0.
    check(s->remove(ctx, "model@0@0@absent").is_not_found(), "a delete of an absent key");
    // Stores meanwhile (of an empty key: refused before they reserve, so not queued behind the evicting store; more
    // than the tombstone's back-off) find no tombstone due: the one in region 0 waits for the header. They neither lock
    // nor scan the pending list. Until session 36 that tombstone counted as due (and was kept), so every store scanned
    // and allocated its retry list until the header was written (review34b).
    const uint64_t scans = s->pending_scans();
    for (int k = 0; k < 64; k++) check(!adp::testing::put_one(*s, ctx, "", kValue).ok(), "a store of an empty key");
    check(s->pending_scans() == scans, std::to_string(s->pending_scans() - scans) +
                                           " of 64 stores while region 0's header is in flight scanned the pending "
                                           "tombstones, none due (the one in region 0 waits for the header)");
    {
      std::lock_guard<std::mutex> l(mu);
      go = true;
      cv.notify_all();
    }
    stores.join();
    check(in_window, "region 0 was evicted");
    // The header write failed: region 0 is back under its old epoch, key 0's older copy with it. Its tombstone is
    // due again: the next store looks at the pending tombstones.
    const uint64_t before = s->pending_scans();
    check(adp::testing::put_one(*s, ctx, key(next++), kValue).ok(), "a store after region 0's eviction failed");
    check(s->pending_scans() == before + 1,
          "the store after region 0's eviction ended looked at the pending tombstones");
    // The stores after it evict every region they may; the newer copy's must not be one of them while that copy's
    // tombstone is not written.
    for (int k = 0; k < 60; k++)
      check(adp::testing::put_one(*s, ctx, key(next++), kValue).ok(), "a store after region 0's eviction failed");
  }
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  auto got = adp::testing::read_object(*s, key(0));
  check(!got || *got == newer, "pending: key 0's superseded copy is its value after the reopen");
}

// A store of key 0 reserved before the eviction of key 0's region (a higher seq) commits while that region's new
// header is in flight: it finds no older copy in the index, so writes no tombstone. The header write then fails and
// the region is put back: key 0's older copy there is marked deleted as a superseded one, guarded by the newer
// copy's region. The newer copy's region then evicted: after the reopen key 0 is the newer
// value or nothing, never the older. With `tombstone_fails` the older copy's header block refuses writes: its
// tombstone stays pending for good, and only the guard (the newer copy's region pinned) keeps the newer copy.
void stored_anew_while_evicted(bool tombstone_fails) {
  const int n = stores_before_first_eviction();
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  const std::vector<uint8_t> newer(4096, 8);  // fits the frontier's tail: its reservation evicts nothing
  {
    FaultDevice* dev;
    auto s = adp::testing::checked_fault_card(image, kCard, "open", &dev);
    if (!s) return;
    adp::IoContext ctx;
    for (int i = 0; i < n; i++) check(adp::testing::put_one(*s, ctx, key(i), kValue).ok(), "fill");
    const uint64_t region0 = adp::kDataOffset;
    const uint64_t older = adp::testing::header_block(*image, key(0));
    check(older < region0 + kRegion, "key 0 is in region 0");
    dev->fail_writes(region0, region0 + adp::kBlockSize);
    if (tombstone_fails) dev->fail_writes(older, older + adp::kBlockSize);
    // The newer copy's store: reserved, written and synced, then waits before its commit (put's still_wanted, asked
    // with no store lock held) for the eviction. Not in its fill: a disk card's store of one I/O is filled before its
    // reservation (the write ahead of aio37), so a fill that waits holds nothing reserved.
    std::mutex mu;
    std::condition_variable cv;
    bool waiting = false, go = false;
    adp::Status anew;
    std::thread a([&] {
      adp::IoContext c;
      std::string k = key(0);
      adp::PutItem item{k, newer.data(), newer.size()};
      s->put(c, &item, 1, &anew, [&] {
        std::unique_lock<std::mutex> l(mu);
        waiting = true;
        cv.notify_all();
        cv.wait(l, [&] { return go; });
        return true;
      });
    });
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return waiting; });
    }
    check(s->stats().evicted_objects == 0, "the newer copy's reservation evicted nothing");
    dev->hold_write(dev->writes());  // the next write: region 0's new header (the eviction for the store below)
    adp::Status st;
    std::thread b([&] {
      adp::IoContext c;
      st = adp::testing::put_one(*s, c, key(n), kValue);
    });
    while (!dev->write_held()) std::this_thread::yield();
    {
      std::lock_guard<std::mutex> l(mu);
      go = true;
      cv.notify_all();
    }
    a.join();  // committed while region 0's header is in flight
    check(anew.ok(), "the newer copy of key 0 stored (" + anew.message() + ")");
    dev->release_held_write(true);  // the header write fails: region 0 put back, another one evicted
    b.join();
    check(st.ok(), "the store whose eviction's header write failed went on (" + st.message() + ")");
    auto got = adp::testing::read_object(*s, ctx, key(0));
    check(got && *got == newer, "key 0 loads its newer copy");
    const uint64_t scans = s->pending_scans();
    for (int k = 0; k < 60; k++)
      check(adp::testing::put_one(*s, ctx, key(n + 1 + k), kValue).ok(), "a store evicting the newer copy");
    if (tombstone_fails) {
      check(s->pending_scans() > scans, "the stores after it tried the older copy's pending tombstone");
      got = adp::testing::read_object(*s, ctx, key(0));
      check(got && *got == newer, "stored anew, its tombstone failing: key 0 still loads its newer copy (pinned)");
    }
  }
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  auto got = adp::testing::read_object(*s, key(0));
  check(!got || *got == newer, std::string(tombstone_fails ? "stored anew, its tombstone failing" : "stored anew") +
                                   ": key 0's superseded copy is its value after the reopen");
}

}  // namespace

int main() {
  evicted_key_deleted(false);
  evicted_key_deleted(true);
  pending_tombstone_in_the_evicted_region();
  stored_anew_while_evicted(false);
  stored_anew_while_evicted(true);
  return adp::testing::finish("evict_header_test");
}
