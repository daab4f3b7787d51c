// SPDX-License-Identifier: Apache-2.0
// LatencyHistogram: lock-free log2 histogram of operation latencies in
// microseconds (bucket i holds [2^i, 2^(i+1)) us; bucket 0 also holds 0).
// Any thread may record; snapshot() is a consistent-enough copy for status
// and metrics (counters are read one by one).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace adp {

class LatencyHistogram {
 public:
  static constexpr int kBuckets = 32;  // up to ~36 minutes

  struct Snapshot {
    uint64_t count = 0;
    uint64_t sum_us = 0;
    std::array<uint64_t, kBuckets> buckets{};
  };

  void record(uint64_t us) {
    int b = us ? 63 - __builtin_clzll(us) : 0;
    if (b >= kBuckets) b = kBuckets - 1;
    buckets_[b].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_us_.fetch_add(us, std::memory_order_relaxed);
  }

  Snapshot snapshot() const {
    Snapshot s;
    s.count = count_.load(std::memory_order_relaxed);
    s.sum_us = sum_us_.load(std::memory_order_relaxed);
    for (int i = 0; i < kBuckets; i++) s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0}, sum_us_{0};
};

}  // namespace adp
