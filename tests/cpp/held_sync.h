// SPDX-License-Identifier: Apache-2.0
// A fault device whose syncs on a thread that asks for it (t_hold_sync) wait until released: a store stays between
// its write and its commit while the test goes on (tests/cpp/outranked_commit_test.cc, lost_sync_commit_test.cc).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "testing/fault_device.h"

namespace adp::testing {

// Set on a thread whose syncs HeldSync holds.
inline thread_local bool t_hold_sync = false;

class HeldSync : public FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  Status sync(uint64_t since) const override {
    if (t_hold_sync) {
      std::unique_lock<std::mutex> l(mu_);
      held_ = true;
      cv_.notify_all();
      cv_.wait(l, [this] { return released_; });
    }
    return FaultDevice::sync(since);
  }
  // Until a sync is held.
  void wait_held() const {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return held_; });
  }
  // Lets the held syncs (and any later one) go on.
  void release() const {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool held_ = false, released_ = false;
};

}  // namespace adp::testing
