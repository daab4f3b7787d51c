// SPDX-License-Identifier: Apache-2.0
// The connector's completion hand-off (convoy36): every completion is queued
// before the eventfd write that signals it, and that write is made with the
// connector's mutex released. Session 36's strace of tmpfs loads: the write
// was made under mu_, and the driver it woke went straight for mu_ in
// drain(), a futex wait and wake for every completion.
//
// The program interposes libc's write(): at each write to the connector's
// eventfd (its writer waiting), a probe thread calls drain(), which takes
// mu_. The probe must get in (a write under mu_: it cannot, until the writer
// returns; given 10 s, then the program fails), and the completions drained by
// then, by the probe and the driver, must number at least the eventfd writes
// seen (each write after its own completion: a write before its completion
// is queued finds one short, the writer being held in write() meanwhile).
// The driver waits only on the eventfd (poll, 30 s): a completion whose
// signal came before it, drained by nobody, leaves it waiting, and fails.
//
// Three parts, 8 workers over the embedded backend on a fault-device card:
//   1. two threads submit stores, loads and lookups (lookups answered at
//      submit: the submit path's completion) while the driver drains;
//   2. loads delayed in their delivery (ADP_TEST_DELIVERY_DELAY_MS) past a
//      short timeout: completed by the deadline thread, queued or held;
//   3. loads pending at close(): completed by close().
// Each part: every future completes once, with its own id.
//
//   completion_signal_test
#include <dlfcn.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
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

using adp::Buffer;
using adp::Completion;
using adp::Connector;
using adp::OpType;
using adp::testing::check;

std::atomic<int> g_event_fd{-1};  // the connector under test's eventfd (-1: none probed)
std::atomic<bool> g_failed{false};

// Completions drained, by the driver and the probe; their ids. Under drain_mu with each drain() call, so that
// once the probe holds it, every drain() before has been counted.
std::mutex drain_mu;
uint64_t drained = 0;
std::set<uint64_t> ids;
int duplicates = 0;

void drain_and_count(Connector& c) {
  std::vector<Completion> got = c.drain();
  drained += got.size();
  for (const Completion& d : got)
    if (!ids.insert(d.future_id).second) duplicates++;
}

// The probe: a thread that drains on request (drain() takes the connector's mutex).
struct Probe {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t asked = 0, answered = 0;
  uint64_t drained_then = 0;  // completions drained once the probe's drain() returned
  Connector* conn = nullptr;
  bool stop = false;
  std::thread thread;

  void run() {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [this] { return stop || asked > answered; });
      if (stop) return;
      l.unlock();
      uint64_t n;
      {
        std::lock_guard<std::mutex> d(drain_mu);
        drain_and_count(*conn);
        n = drained;
      }
      l.lock();
      drained_then = n;
      answered++;
      cv.notify_all();
    }
  }
} probe;

std::atomic<uint64_t> g_writes{0};  // eventfd writes seen
std::mutex probe_call_mu;           // one probe at a time (writers from several threads)

// At a write to the eventfd, before it is made: the probe's drain() must get in, and find every completion signalled.
void at_signal() {
  std::lock_guard<std::mutex> one(probe_call_mu);
  if (g_failed.load()) return;
  const uint64_t k = g_writes.fetch_add(1) + 1;
  std::unique_lock<std::mutex> l(probe.mu);
  const uint64_t ticket = ++probe.asked;
  probe.cv.notify_all();
  if (!probe.cv.wait_for(l, std::chrono::seconds(10), [&] { return probe.answered >= ticket; })) {
    g_failed = true;
    std::printf("FAIL: eventfd write %llu made with the connector's mutex held (a drain() could not take it in 10 s)\n",
                static_cast<unsigned long long>(k));
    std::fflush(stdout);
    std::_Exit(1);  // the probe stays blocked on the mutex this thread holds
  }
  if (probe.drained_then < k) {
    g_failed = true;
    std::printf("FAIL: eventfd write %llu made before its completion was queued (%llu drained by then)\n",
                static_cast<unsigned long long>(k), static_cast<unsigned long long>(probe.drained_then));
  }
}

}  // namespace

extern "C" ssize_t write(int fd, const void* buf, size_t count) {
  using Fn = ssize_t (*)(int, const void*, size_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "write"));
  if (fd >= 0 && fd == g_event_fd.load(std::memory_order_relaxed) && count == sizeof(uint64_t)) at_signal();
  return real(fd, buf, count);
}

namespace {

// Drains c on its eventfd (poll only, 30 s a wait) until `total` completions have been drained in all.
void drive(Connector& c, uint64_t total, const std::string& part) {
  for (;;) {
    {
      std::lock_guard<std::mutex> d(drain_mu);
      if (drained >= total) break;
    }
    pollfd p{c.event_fd(), POLLIN, 0};
    if (::poll(&p, 1, 30000) <= 0) {
      std::lock_guard<std::mutex> d(drain_mu);
      check(false, part + ": no eventfd signal for 30 s with " + std::to_string(total - drained) +
                       " completions not drained (a wake-up lost)");
      return;
    }
    std::lock_guard<std::mutex> d(drain_mu);
    drain_and_count(c);
  }
  std::lock_guard<std::mutex> d(drain_mu);
  check(drained == total && duplicates == 0, part + ": every future completes once (" + std::to_string(drained) +
                                                 " of " + std::to_string(total) + ", " + std::to_string(duplicates) +
                                                 " twice)");
}

void reset_counts() {
  std::lock_guard<std::mutex> d(drain_mu);
  drained = 0;
  ids.clear();
  duplicates = 0;
  g_writes = 0;
}

std::shared_ptr<adp::CardStore> new_card(const char* name) {
  constexpr uint64_t kRegionBytes = 1ull << 20;
  return adp::testing::checked_fault_card(
      std::make_shared<adp::testing::FaultImage>(adp::testing::card_bytes(16, kRegionBytes)),
      adp::testing::card_options(kRegionBytes), "open", static_cast<adp::testing::FaultDevice**>(nullptr), name);
}

std::unique_ptr<Connector> probed_connector(std::shared_ptr<adp::CardStore> store, int workers, int timeout_ms) {
  auto c = adp::testing::embedded_connector(std::move(store), workers, timeout_ms);
  probe.conn = c.get();
  g_event_fd = c->event_fd();
  return c;
}

void unprobe() {
  g_event_fd = -1;
  std::lock_guard<std::mutex> l(probe.mu);
  probe.conn = nullptr;
}

constexpr size_t kValue = 4096;
constexpr int kKeys = 64;
std::string key(int i) { return "signal@0@0@" + std::to_string(i); }

}  // namespace

int main() {
  probe.thread = std::thread([] { probe.run(); });
  std::vector<uint8_t> value(kValue, 5);

  {  // 1. stores, loads and lookups from two threads, 8 workers
    auto store = new_card("signal-card");
    if (!store) return 1;
    reset_counts();
    auto c = probed_connector(store, 8, 30000);
    constexpr int kPerThread = 600;
    std::vector<std::vector<std::vector<uint8_t>>> load_bufs(  // each load's buffers, until the connector closes
        2, std::vector<std::vector<uint8_t>>(3 * kPerThread, std::vector<uint8_t>(kValue)));
    std::vector<std::thread> submitters;
    for (int t = 0; t < 2; t++) {
      submitters.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; i++) {
          const int n = 1 + (i % 3);
          const OpType op = i % 3 == 0 ? OpType::kSet : i % 3 == 1 ? OpType::kGet : OpType::kExists;
          std::vector<std::string> keys;
          std::vector<Buffer> b;
          for (int j = 0; j < n; j++) {
            keys.push_back(key((i * 7 + j + t * 13) % kKeys));
            if (op == OpType::kSet) b.push_back({value.data(), kValue});
            if (op == OpType::kGet) b.push_back({load_bufs[t][i * 3 + j].data(), kValue});  // its own, kept
          }
          c->submit(op, std::move(keys), std::move(b), nullptr);
        }
      });
    }
    drive(*c, 2 * kPerThread, "part 1 (stores, loads, lookups)");
    for (auto& s : submitters) s.join();
    c->close();  // its workers joined: no eventfd write after it
    std::printf("part 1: %llu eventfd writes for %llu completions\n", static_cast<unsigned long long>(g_writes.load()),
                static_cast<unsigned long long>(drained));
    unprobe();
  }

  {  // 2. loads past their deadline: completed by the deadline thread (queued, or held then by their worker)
    auto store = new_card("signal-deadline");
    if (!store) return 1;
    {
      auto setup = adp::testing::embedded_connector(store, 2, 30000);
      for (int i = 0; i < 8; i++)
        check(adp::testing::run(*setup, OpType::kSet, {key(i)}, {{value.data(), kValue}}).ok, "a store for part 2");
      setup->close();
    }
    reset_counts();
    ::setenv("ADP_TEST_DELIVERY_DELAY_MS", "20", 1);  // read at the connector's construction
    auto c = probed_connector(store, 2, 5);
    ::unsetenv("ADP_TEST_DELIVERY_DELAY_MS");
    constexpr int kLoads = 40;
    std::vector<std::vector<uint8_t>> bufs(kLoads, std::vector<uint8_t>(kValue));
    for (int i = 0; i < kLoads; i++) c->submit(OpType::kGet, {key(i % 8)}, {{bufs[i].data(), kValue}}, nullptr);
    drive(*c, kLoads, "part 2 (deadlines)");
    c->close();
    std::printf("part 2: %llu eventfd writes for %llu completions\n", static_cast<unsigned long long>(g_writes.load()),
                static_cast<unsigned long long>(drained));
    unprobe();

    // 3. loads pending at close()
    reset_counts();
    ::setenv("ADP_TEST_DELIVERY_DELAY_MS", "20", 1);
    auto d = probed_connector(store, 2, 30000);
    ::unsetenv("ADP_TEST_DELIVERY_DELAY_MS");
    for (int i = 0; i < kLoads; i++) d->submit(OpType::kGet, {key(i % 8)}, {{bufs[i].data(), kValue}}, nullptr);
    d->close();
    drive(*d, kLoads, "part 3 (close)");
    std::printf("part 3: %llu eventfd writes for %llu completions\n", static_cast<unsigned long long>(g_writes.load()),
                static_cast<unsigned long long>(drained));
    unprobe();
  }

  {
    std::lock_guard<std::mutex> l(probe.mu);
    probe.stop = true;
    probe.cv.notify_all();
  }
  probe.thread.join();
  check(!g_failed.load(), "every eventfd write comes after its completion, with the connector's mutex released");
  return adp::testing::finish("completion_signal_test");
}
