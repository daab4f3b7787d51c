// SPDX-License-Identifier: Apache-2.0
// IoContextPool: the gateway's fixed set of IoContexts (staging memory and an
// open region each). A request leases one while it runs against the store,
// so store concurrency, staging memory and the number of open regions stay
// bounded however many clients connect; a request finding none free waits,
// until its deadline at most.
// Thread-safe. Must be destroyed before the store (contexts seal their regions).
#pragma once

#include <condition_variable>
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

  // A lease, or null if none came free by `deadline`.
  template <typename TimePoint>
  std::unique_ptr<Lease> acquire(TimePoint deadline) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_until(l, deadline, [this] { return !free_.empty(); })) return nullptr;
    auto ctx = std::move(free_.back());
    free_.pop_back();
    return std::make_unique<Lease>(this, std::move(ctx));
  }

 private:
  void give_back(std::unique_ptr<IoContext> ctx) {
    {
      std::lock_guard<std::mutex> l(mu_);
      free_.push_back(std::move(ctx));
    }
    cv_.notify_one();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<IoContext>> free_;
};

}  // namespace adp
