// SPDX-License-Identifier: Apache-2.0
// FailingHold: a failing/working verdict with hysteresis (review r10 R2).
// Failing from the first error until an operation succeeds kFailingHold or
// more after the last error, so I/O that fails and works interleaved (a bad
// range of a card: some objects fail, the rest hit) reads failing
// throughout, and an episode logs one start and one end (with its error
// count) instead of a pair per item. Thread-safe; a success while working
// costs one relaxed load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace adp {

// How long after a card's last I/O error a success ends its failing episode
// (README "Operations", docs/stats.md: gateway_card_healthy, healthy).
inline constexpr std::chrono::milliseconds kFailingHold{10000};

// The hold of this process: kFailingHold, or ADP_TEST_CARD_FAILING_HOLD_MS
// as the last gateway or connector start read it (tests only).
inline std::atomic<int64_t>& failing_hold_ms() {
  static std::atomic<int64_t> ms{kFailingHold.count()};
  return ms;
}

class FailingHold {
 public:
  using Clock = std::chrono::steady_clock;
  struct Change {
    bool started = false;  // the first error of an episode: log it
    bool ended = false;    // the success that ends one: log it with errors and seconds
    uint64_t errors = 0;
    double seconds = 0;
  };

  Change error() {
    std::lock_guard<std::mutex> l(mu_);
    const auto now = Clock::now();
    Change c;
    if (!failing_.load(std::memory_order_relaxed)) {
      failing_.store(true, std::memory_order_relaxed);
      c.started = true;
      errors_ = 0;
      since_ = now;
    }
    errors_++;
    last_error_ = now;
    return c;
  }

  Change success() {
    if (!failing_.load(std::memory_order_relaxed)) return {};
    std::lock_guard<std::mutex> l(mu_);
    const auto now = Clock::now();
    Change c;
    if (!failing_.load(std::memory_order_relaxed) ||
        now - last_error_ < std::chrono::milliseconds(failing_hold_ms().load(std::memory_order_relaxed)))
      return c;
    failing_.store(false, std::memory_order_relaxed);
    c.ended = true;
    c.errors = errors_;
    c.seconds = std::chrono::duration<double>(now - since_).count();
    return c;
  }

  bool failing() const { return failing_.load(std::memory_order_relaxed); }

 private:
  std::mutex mu_;
  std::atomic<bool> failing_{false};
  uint64_t errors_ = 0;
  Clock::time_point since_{}, last_error_{};
};

}  // namespace adp
