// SPDX-License-Identifier: Apache-2.0
// The card's fill at its first eviction (StoreStats::first_eviction_*,
// docs/card_format.md "Capacity") counts what the card held then: the
// objects indexed plus the stores reserved and being written, each key once,
// failed stores not at all, and not the store whose reservation evicted.
// Built and run by tests/store/test_capacity.py.
//
// On a fault device of 10 regions of 1 MiB, objects of 200 KiB (footprint
// 204 KiB: five fill a region exactly, 50 the card): 44 objects are stored
// one by one; then six stores are put in flight at once: A (its write held,
// then failed), b1..b3, a re-store of key 43 (held then: counted once), and
// b4 whose caller gives up (not acknowledged). All of them wait behind A. A
// seventh store, Z, finds no free region and evicts the oldest. Then A's
// write fails and the rest go on. Expected: at the eviction 44 objects held
// and 6 in flight; in the end 4 of those acknowledged, 2 failed, and the
// held payload 47 objects (44 + b1..b3; the re-store of 43 replaces its
// older copy, A and b4 failed, Z came after).
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::IoContext;
using adp::Status;
using adp::testing::put_one;

constexpr uint64_t kRegionBytes = 1ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(10, kRegionBytes);
constexpr uint64_t kSize = 200 << 10;

struct Store {
  std::string key;
  bool wanted = true;
  Status result;
  IoContext ctx;
  std::thread thread;
};

void wait_for(const std::function<bool()>& cond, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "FAIL: timed out waiting for %s\n", what);
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int main() {
  adp::testing::FaultDevice* dev;
  auto s =
      adp::testing::checked_fault_card(std::make_shared<adp::testing::FaultImage>(kCardBytes),
                                       adp::testing::card_options(kRegionBytes), "open", &dev, "first-eviction-card");
  if (!s) return 1;
  CHECK(s->stats().num_regions == 10, "expected 10 regions, got %" PRIu64, s->stats().num_regions);
  std::vector<uint8_t> value(kSize, 0x5a);
  IoContext ctx;
  for (int i = 0; i < 44; i++) {
    Status r = put_one(*s, ctx, "obj-" + std::to_string(i), value);
    CHECK(r.ok(), "store %d: %s", i, r.message().c_str());
  }
  CHECK(s->stats().evicted_objects == 0, "evicted before the card was full");

  // Six stores in flight: A's write is held; each of the others waits for
  // A's ticket after its write. Each is started once the one before it has
  // written (so all six are reserved before Z).
  std::vector<std::unique_ptr<Store>> inflight;
  for (const char* key : {"a", "b1", "b2", "b3", "obj-43", "b4"}) {
    auto x = std::make_unique<Store>();
    x->key = key;
    x->wanted = x->key != "b4";
    inflight.push_back(std::move(x));
  }
  dev->hold_write(dev->writes());
  {
    Store& a = *inflight[0];
    a.thread = std::thread([&] { a.result = put_one(*s, a.ctx, a.key, value, a.wanted); });
    wait_for([&] { return dev->write_held(); }, "A's write to be held");
  }
  for (size_t i = 1; i < inflight.size(); i++) {
    Store& x = *inflight[i];
    uint64_t before = dev->writes();
    x.thread = std::thread([&] { x.result = put_one(*s, x.ctx, x.key, value, x.wanted); });
    wait_for([&] { return dev->writes() > before && dev->writes() >= before + (i == 1 ? 2 : 1); }, "a store's write");
  }
  // Z: no region is free; the oldest is evicted for it.
  Status zr;
  IoContext zctx;
  std::thread z([&] { zr = put_one(*s, zctx, "z", value); });
  wait_for([&] { return s->stats().evicted_objects > 0; }, "the first eviction");
  adp::StoreStats at = s->stats();
  CHECK(at.first_eviction_held_bytes == 44 * kSize, "at the eviction: held %" PRIu64 " bytes, expected 44 objects",
        at.first_eviction_held_bytes);
  CHECK(at.first_eviction_inflight_stores == 6, "at the eviction: %" PRIu64 " stores in flight, expected 6",
        at.first_eviction_inflight_stores);
  CHECK(at.first_eviction_inflight_acked == 0 && at.first_eviction_inflight_failed == 0,
        "at the eviction: %" PRIu64 " acknowledged, %" PRIu64 " failed before any could finish",
        at.first_eviction_inflight_acked, at.first_eviction_inflight_failed);

  dev->release_held_write(/*fail=*/true);
  for (auto& x : inflight) x->thread.join();
  z.join();
  CHECK(!inflight[0]->result.ok(), "A's write failed but A was acknowledged");
  for (size_t i = 1; i < 5; i++)
    CHECK(inflight[i]->result.ok(), "%s: %s", inflight[i]->key.c_str(), inflight[i]->result.message().c_str());
  CHECK(!inflight[5]->result.ok(), "b4's caller gave up but b4 was acknowledged");
  CHECK(zr.ok(), "z: %s", zr.message().c_str());

  adp::StoreStats end = s->stats();
  CHECK(end.first_eviction_inflight_stores == 6, "%" PRIu64 " stores in flight at the eviction, expected 6",
        end.first_eviction_inflight_stores);
  CHECK(end.first_eviction_inflight_acked == 4, "%" PRIu64 " of them acknowledged, expected 4 (b1..b3, obj-43)",
        end.first_eviction_inflight_acked);
  CHECK(end.first_eviction_inflight_failed == 2, "%" PRIu64 " of them failed, expected 2 (a, b4)",
        end.first_eviction_inflight_failed);
  CHECK(end.first_eviction_held_bytes == 47 * kSize,
        "held at the first eviction: %" PRIu64 " bytes = %.2f objects, expected 47 (44 held, b1..b3; obj-43 once)",
        end.first_eviction_held_bytes, double(end.first_eviction_held_bytes) / kSize);
  CHECK(end.payload_bytes == end.objects * kSize, "payload_bytes %" PRIu64 " for %" PRIu64 " objects",
        end.payload_bytes, end.objects);
  std::printf("first_eviction_test: held %.0f objects at the first eviction, %" PRIu64 " in flight (%" PRIu64
              " acknowledged, %" PRIu64 " failed)\n",
              double(end.first_eviction_held_bytes) / kSize, end.first_eviction_inflight_stores,
              end.first_eviction_inflight_acked, end.first_eviction_inflight_failed);
  return adp::testing::finish("first_eviction_test");
}
