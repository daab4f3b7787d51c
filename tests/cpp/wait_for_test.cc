// SPDX-License-Identifier: Apache-2.0
// The test helper wait_for (test_connector.h) with two futures that complete
// together, waited for in the reverse order: the first wait drains both
// completions and must keep the other one for its own wait (it used to drop
// it, and that wait then ran to its deadline). The second wait has a short
// deadline (5 s), so the old helper fails here fast instead of hanging.
// Then the same through run() while a future submitted before it is pending.
// The Connector over the embedded backend, on a FaultDevice card.
//
//   wait_for_test
#include <chrono>
#include <memory>
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

using adp::Completion;
using adp::OpType;
using adp::testing::check;
using adp::testing::wait_for;

// Waits until c has completed `n` futures of `op` in all (their completions queued, none drained).
void until_completed(adp::Connector& c, OpType op, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (c.latency(op).count < n && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  check(c.latency(op).count >= n, "the futures complete");
}

}  // namespace

int main() {
  constexpr uint64_t kRegionBytes = 1ull << 20;
  std::shared_ptr<adp::CardStore> store = adp::testing::checked_fault_card(
      std::make_shared<adp::testing::FaultImage>(adp::testing::card_bytes(8, kRegionBytes)),
      adp::testing::card_options(kRegionBytes), "open", static_cast<adp::testing::FaultDevice**>(nullptr),
      "wait-for-card");
  if (!store) return 1;
  auto c = adp::testing::embedded_connector(store, 2, 30000);
  constexpr auto kShort = std::chrono::seconds(5);

  const uint64_t first = c->submit(OpType::kExists, {"wait@first"}, {}, nullptr);
  const uint64_t second = c->submit(OpType::kExists, {"wait@second"}, {}, nullptr);
  until_completed(*c, OpType::kExists, 2);
  Completion b = wait_for(*c, second, kShort);
  check(b.future_id == second && b.ok, "the second future's completion, waited for first: " + b.error);
  Completion a = wait_for(*c, first, kShort);  // drained by the wait above: kept for this one
  check(a.future_id == first && a.ok, "the first future's completion, waited for after: " + a.error);

  // run() waits for its own future while one submitted before it completes too.
  const uint64_t pending = c->submit(OpType::kExists, {"wait@pending"}, {}, nullptr);
  until_completed(*c, OpType::kExists, 3);
  Completion r = adp::testing::run(*c, OpType::kExists, {"wait@run"});
  check(r.ok && r.future_id != pending, "run() returns its own future's completion: " + r.error);
  Completion p = wait_for(*c, pending, kShort);
  check(p.future_id == pending && p.ok, "the pending future's completion, kept through run(): " + p.error);
  c->close();
  return adp::testing::finish("wait_for_test");
}
