// SPDX-License-Identifier: Apache-2.0
// A fault device whose syncs on a thread that asks for it (t_hold_sync) wait until released: a store stays between
// its write and its commit while the test goes on (tests/cpp/outranked_commit_test.cc, lost_sync_commit_test.cc);
// HeldReads the same for reads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "testing/fault_device.h"

namespace adp::testing {

// Where a device call of a test thread waits: held() blocks the caller until release(); wait_held(n) waits until n
// callers are (or were) held there.
class HoldPoint {
 public:
  void held() const {
    std::unique_lock<std::mutex> l(mu_);
    held_++;
    cv_.notify_all();
    cv_.wait(l, [this] { return released_; });
  }
  // Until n calls are held.
  void wait_held(int n = 1) const {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return held_ >= n; });
  }
  // Lets the held calls (and any later one) go on.
  void release() const {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable int held_ = 0;
  mutable bool released_ = false;
};

// Set on a thread whose syncs HeldSync holds.
inline thread_local bool t_hold_sync = false;

class HeldSync : public FaultDevice, public HoldPoint {
 public:
  using FaultDevice::FaultDevice;
  Status sync(uint64_t since) const override {
    if (t_hold_sync) held();
    return FaultDevice::sync(since);
  }
};

// Set on a thread whose reads HeldReads holds.
inline thread_local bool t_hold_read = false;

// Its reads on a thread that asks for it (t_hold_read) wait until released: a load stays in flight, the regions of
// its object pinned, while the test goes on (tests/cpp/region_wait_test.cc).
class HeldReads : public FaultDevice, public HoldPoint {
 public:
  using FaultDevice::FaultDevice;
  Status readv(uint64_t offset, const iovec* iov, int count) const override {
    if (t_hold_read) held();
    return FaultDevice::readv(offset, iov, count);
  }
};

}  // namespace adp::testing
