// SPDX-License-Identifier: Apache-2.0
// review33b F1: one batch whose guard a worker holds past its deadline (a
// load into a segment or process memory whose gateway was stopped, SIGSTOP,
// in the middle of an object: RemoteSession::revoke_lease waits out the
// WRITING lease inside guarded(), docs/protocol.md "The load lease") must
// hold back that future only. The deadline thread marks a due batch
// completed by taking its guard exclusively (Connector::deadline_loop,
// Batch::mark_completed): it waits there for the held guard, and every
// other future's deadline waits behind it. Part 1: a second batch, queued
// behind the held one (one worker), must still complete, failed, by its own
// deadline; it is never started, so nothing of it is in use. Part 2: close()
// waits for the held batch holding the connector's lock (stop_threads:
// complete_locked -> mark_completed), so a drain() meanwhile (the binding
// calls it with the GIL held) blocks too; it must return.
//
// The backend is a fake: its get holds the batch's guard (guarded()) until
// the test lets it go, as the stuck revoke does; its exists answers at once.
//
//   held_guard_deadline_test
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "connector/connector.h"
#include "test_connector.h"

namespace {

using adp::Buffer;
using adp::Completion;
using adp::OpType;
using adp::Status;
using adp::testing::check;
using Clock = std::chrono::steady_clock;

// Whether the get is inside its guarded read, and whether the test let it go.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, released = false, interrupted = false;
  void wait_holding() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [this] { return holding; });
  }
  void wait_interrupted() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [this] { return interrupted; });
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    released = true;
    cv.notify_all();
  }
};

class HoldingSession : public adp::BackendSession {
 public:
  explicit HoldingSession(Gate* gate) : gate_(gate) {}
  void put(const adp::PutItem*, size_t n, Status* results, adp::Deadline, const adp::GuardedReadFn&) override {
    for (size_t i = 0; i < n; i++) results[i] = Status::Ok();
  }
  void get(const std::string_view*, const size_t*, uint8_t* const*, size_t n, Status* results, adp::Deadline,
           const adp::DeliverFn&, const adp::GuardedReadFn& guarded) override {
    // The peer writes into the caller's buffer under the guard; its deadline passes; the revoke waits out the
    // peer's WRITING (a stopped gateway: until it continues).
    guarded([this] {
      std::unique_lock<std::mutex> l(gate_->mu);
      gate_->holding = true;
      gate_->cv.notify_all();
      gate_->cv.wait(l, [this] { return gate_->released; });
    });
    for (size_t i = 0; i < n; i++) results[i] = Status::TimedOut("deadline passed");
  }
  void exists(const std::string_view*, size_t n, Status* results, adp::Deadline) override {
    for (size_t i = 0; i < n; i++) results[i] = Status::NotFound();
  }
  void remove(const std::string_view*, size_t n, Status* results, adp::Deadline) override {
    for (size_t i = 0; i < n; i++) results[i] = Status::NotFound();
  }

 private:
  Gate* gate_;
};

class HoldingBackend : public adp::Backend {
 public:
  explicit HoldingBackend(Gate* gate) : gate_(gate) {}
  std::unique_ptr<adp::BackendSession> new_session() override { return std::make_unique<HoldingSession>(gate_); }
  std::string describe() const override { return "holding fake backend"; }
  adp::StoreStats stats() const override { return {}; }
  // Called by close() (Connector::stop_threads) while it holds the connector's lock: close() is under way.
  void interrupt() override {
    std::lock_guard<std::mutex> l(gate_->mu);
    gate_->interrupted = true;
    gate_->cv.notify_all();
  }

 private:
  Gate* gate_;
};

// Part 1: a future queued behind the held batch completes, failed, by its own deadline.
void queued_future_meets_its_deadline() {
  constexpr int kTimeoutMs = 300;
  Gate gate;
  adp::ConnectorOptions opts;
  opts.num_workers = 1;
  opts.timeout_ms = kTimeoutMs;
  auto c = std::make_unique<adp::Connector>(std::make_unique<HoldingBackend>(&gate), opts);
  std::vector<uint8_t> buf(4096);
  const uint64_t held = c->submit(OpType::kGet, {"held@1"}, {Buffer{buf.data(), buf.size()}}, nullptr);
  gate.wait_holding();
  const auto submitted = Clock::now();
  const uint64_t queued = c->submit(OpType::kExists, {"queued@1"}, {}, nullptr);
  Completion q{}, h{};
  bool got = false, held_done = false;
  // Its deadline is kTimeoutMs away; 10 s is far past it, on any load.
  while (!got && Clock::now() < submitted + std::chrono::seconds(10)) {
    for (Completion& d : c->drain()) {
      if (d.future_id == queued) {
        q = std::move(d);
        got = true;
      } else if (d.future_id == held) {
        held_done = true;
      }
    }
    if (!got) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // docs/protocol.md (review33b N2): the held future itself completes only once its guard is let go (its
  // buffer may still be written until then), and then as timed out, whatever its worker made of it.
  check(!held_done, "the future whose guard is held stays pending while it is held");
  gate.release();
  while (!held_done && Clock::now() < submitted + std::chrono::seconds(20)) {
    for (Completion& d : c->drain()) {
      if (d.future_id == held) {
        h = std::move(d);
        held_done = true;
      }
    }
    if (!held_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  check(held_done && !h.ok && h.error.find("timed out") != std::string::npos,
        "the held future completes, timed out, once its guard is let go: " + h.error);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - submitted).count();
  std::printf("part 1: the queued future %s after %lld ms (timeout %d ms)\n", got ? "completed" : "still pending",
              static_cast<long long>(waited), kTimeoutMs);
  check(got, "a future queued behind a batch whose guard is held completes by its own deadline (it waited " +
                 std::to_string(waited) + " ms, timeout " + std::to_string(kTimeoutMs) + " ms)");
  check(!got || !q.ok, "that future completes as failed (timed out): " + q.error);
  c->close();
}

// Part 2: close() waits for the held batch (it joins its worker), but not holding what drain() needs: drain()
// (which the binding calls with the GIL held) returns meanwhile.
void drain_returns_while_close_waits() {
  Gate gate;
  adp::ConnectorOptions opts;
  opts.num_workers = 1;
  opts.timeout_ms = 30000;
  auto c = std::make_unique<adp::Connector>(std::make_unique<HoldingBackend>(&gate), opts);
  std::vector<uint8_t> buf(4096);
  const uint64_t held = c->submit(OpType::kGet, {"held@2"}, {Buffer{buf.data(), buf.size()}}, nullptr);
  gate.wait_holding();
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    c->close();
    closed = true;
  });
  gate.wait_interrupted();  // close() under way: what follows in it waits for the held batch, unbounded
  std::atomic<bool> drained{false}, held_early{false};
  std::thread drainer([&] {
    for (const Completion& d : c->drain()) held_early = held_early || d.future_id == held;
    drained = true;
  });
  const auto from = Clock::now();
  while (!drained && Clock::now() < from + std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool returned = drained;
  std::printf("part 2: drain() %s while close() waited for the held batch\n", returned ? "returned" : "blocked");
  check(returned, "drain() returns while close() waits for a batch whose guard is held (it blocked 10 s)");
  gate.release();
  closer.join();
  drainer.join();
  check(closed, "close() returns once the held batch lets go");
  check(!held_early, "the held future had not completed while its guard was held");
  bool found = false;
  for (const Completion& d : c->drain())
    if (d.future_id == held) {
      found = true;
      check(!d.ok && d.error == "connector closed", "close() completes the held future as closed: " + d.error);
    }
  check(found, "close() completes the held future once its worker let go");
}

}  // namespace

int main() {
  queued_future_meets_its_deadline();
  drain_returns_while_close_waits();
  return adp::testing::finish("held_guard_deadline_test");
}
