// SPDX-License-Identifier: Apache-2.0
// IoContextPool: the gateway's fixed set of IoContexts (staging memory and an
// open region each). A request leases one while it runs against the store,
// so store concurrency, staging memory and the number of open regions stay
// bounded however many clients connect; a request finding none free waits,
// until its deadline at most (calling `waiting` every kWaitSlice meanwhile:
// the connection bumps its alive word there if contexts moved since, given
// back or used for card work (ClientHandler::card_moved, review r10 R3b), so
// its client reads a busy gateway working and a wedged one stalled, r7).
// Thread-safe. Must be destroyed before the store (contexts seal their regions).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "store/card_store.h"

namespace adp {

class IoContextPool {
 public:
  explicit IoContextPool(size_t n) {
    for (size_t i = 0; i < n; i++) free_.push_back(std::make_unique<IoContext>());
  }

  class Lease {
   public:
    Lease(IoContextPool* pool, std::unique_ptr<IoContext> ctx) : pool_(pool), ctx_(std::move(ctx)) {}
    ~Lease() { pool_->give_back(std::move(ctx_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    IoContext& operator*() const { return *ctx_; }

   private:
    IoContextPool* pool_;
    std::unique_ptr<IoContext> ctx_;
  };

  // How often a waiting acquire() calls its `waiting`: well inside the
  // smallest stall bound a connector is likely given (gateway_stall_s).
  static constexpr std::chrono::milliseconds kWaitSlice{100};

  // A lease, or null if none came free by `deadline`. While none is free,
  // `waiting` (if any) is called once per kWaitSlice of the wait, without
  // the pool's lock: by time waited, so a waiter woken often by contexts
  // that others then take still calls it (review r10 N7); no busy loop.
  template <typename TimePoint>
  std::unique_ptr<Lease> acquire(TimePoint deadline, const std::function<void()>& waiting = {}) {
    std::unique_lock<std::mutex> l(mu_);
    auto slice_end = TimePoint::clock::now() + kWaitSlice;
    while (free_.empty()) {
      const auto now = TimePoint::clock::now();
      if (now >= deadline) return nullptr;
      if (!waiting) {
        cv_.wait_until(l, deadline);
        continue;
      }
      if (now >= slice_end) {
        slice_end = now + kWaitSlice;
        l.unlock();
        waiting();
        l.lock();
        continue;
      }
      cv_.wait_until(l, std::min<TimePoint>(deadline, slice_end));
    }
    auto ctx = std::move(free_.back());
    free_.pop_back();
    return std::make_unique<Lease>(this, std::move(ctx));
  }

  // Contexts given back so far: a waiter tells a pool that moves from a
  // wedged one by it (review r10 R3).
  uint64_t released() const { return released_.load(std::memory_order_relaxed); }

 private:
  void give_back(std::unique_ptr<IoContext> ctx) {
    {
      std::lock_guard<std::mutex> l(mu_);
      free_.push_back(std::move(ctx));
    }
    released_.fetch_add(1, std::memory_order_relaxed);
    cv_.notify_one();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<IoContext>> free_;
  std::atomic<uint64_t> released_{0};
};

}  // namespace adp
