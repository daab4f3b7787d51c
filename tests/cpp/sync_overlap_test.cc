// SPDX-License-Identifier: Apache-2.0
// A connector worker of a durable embedded card writes its next store while the flush of its last one runs
// (session 36, brief behind36: the sync off the writer's path; Connector::worker_loop's lanes). One worker, a
// fault device whose next flush (the fdatasync itself, inside GroupSync) waits until released. Checks:
//   - batch 1 written, its flush held: batch 2, submitted then, is written meanwhile (its writes reach the
//     device while batch 1's flush is held; before session 36 the worker sat in that flush and batch 2 waited
//     in the queue), and neither batch's keys are visible or completed before that flush returns;
//   - released: both acknowledged, their keys visible, and on the card after a reopen;
//   - that held flush failed instead: batch 1 fails, and batch 2 too (written while it ran: a write issued
//     before a failed flush returned may be lost, util/group_sync.h), none of their keys visible or on the card
//     after a reopen; batch 3, submitted after both completed, is acknowledged and on the card after the reopen.
//
//   sync_overlap_test
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "connector/connector.h"
#include "store/card_store.h"
#include "test_card.h"
#include "test_connector.h"
#include "testing/fault_device.h"

namespace {

using adp::testing::check;
using adp::testing::FaultImage;

constexpr uint64_t kRegionBytes = 4ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(8, kRegionBytes);

// The next flush after hold_next() waits in it (GroupSync's flush, the device's fdatasync) until release().
using HeldFlush = adp::testing::HeldFlushDevice;

std::unique_ptr<adp::CardStore> open_card(const std::shared_ptr<FaultImage>& image, const std::string& what,
                                          HeldFlush** dev = nullptr) {
  return adp::testing::checked_fault_card<HeldFlush>(image, adp::testing::card_options(kRegionBytes), what, dev);
}

void overlap(bool fail) {
  const std::string what = fail ? "overlap, the held flush failed" : "overlap";
  auto image = std::make_shared<FaultImage>(kCardBytes);
  HeldFlush* dev;
  std::shared_ptr<adp::CardStore> store = open_card(image, what + ": open", &dev);
  if (!store) return;
  auto conn = adp::testing::embedded_connector(store, 1, 120000);
  std::vector<std::vector<uint8_t>> values;
  values.reserve(8);
  auto key = [](int b, int i) { return "m@00000000@0@o" + std::to_string(b) + "-" + std::to_string(i); };
  auto batch = [&](int b) { return adp::testing::submit_two_keys(*conn, key, b, values); };
  auto visible = [&](int b) { return int(store->exists(key(b, 0))) + int(store->exists(key(b, 1))); };
  check(adp::testing::wait_for(*conn, batch(0)).ok, what + ": warm-up store");  // opens the worker's region
  if (fail) dev->fail_sync(dev->syncs_run());
  dev->hold_next();
  const uint64_t id1 = batch(1);
  const bool held = dev->wait_held();
  check(held, what + ": batch 1's flush began");
  if (!held) {
    dev->release();
    return;
  }
  const uint64_t before = dev->writes();
  const uint64_t id2 = batch(2);
  // Batch 2's two objects (64 KiB each, one write each) reach the device while batch 1's flush is held. Before
  // session 36 they never did: the worker was in that flush (waited for up to 10 s, then released).
  bool overlapped = false;
  for (int i = 0; i < 10000 && !overlapped; i++) {
    overlapped = dev->writes() >= before + 2;
    if (!overlapped) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(overlapped, "%s: batch 2 was not written while batch 1's flush ran (%llu writes meanwhile, 2 wanted)",
        what.c_str(), (unsigned long long)(dev->writes() - before));
  CHECK(visible(1) == 0 && visible(2) == 0,
        "%s: keys visible before batch 1's flush returned (batch 1: %d, batch 2: %d)", what.c_str(), visible(1),
        visible(2));
  std::map<uint64_t, bool> done;
  for (const adp::Completion& c : conn->drain()) done[c.future_id] = c.ok;
  CHECK(done.empty(), "%s: %zu batches completed before batch 1's flush returned", what.c_str(), done.size());
  dev->release();
  for (int i = 0; i < 6000 && !(done.count(id1) && done.count(id2)); i++) {
    for (const adp::Completion& c : conn->drain()) done[c.future_id] = c.ok;
    if (!(done.count(id1) && done.count(id2))) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int b = 1; b <= 2; b++) {
    const uint64_t id = b == 1 ? id1 : id2;
    CHECK(done.count(id) && done[id] == !fail, "%s: batch %d %s", what.c_str(), b,
          done.count(id) ? (done[id] ? "acknowledged" : "failed") : "not completed");
    CHECK(visible(b) == (fail ? 0 : 2), "%s: batch %d has %d keys visible", what.c_str(), b, visible(b));
  }
  if (fail) check(adp::testing::wait_for(*conn, batch(3)).ok, what + ": batch 3, after the failed flush");
  conn->close();
  conn.reset();
  store.reset();
  auto again = open_card(image, what + ": reopen");
  for (int b = 1; again && b <= (fail ? 3 : 2); b++)
    for (int i = 0; i < 2; i++) {
      const bool want = !fail || b == 3;
      const auto got = adp::testing::read_object(*again, key(b, i));
      CHECK(want ? got == values[2 * b + i] : !got, "%s: batch %d key %d %s after the reopen", what.c_str(), b, i,
            want ? "not on the card" : "on the card");
    }
}

}  // namespace

int main() {
  overlap(false);
  overlap(true);
  return adp::testing::finish("sync_overlap_test");
}
