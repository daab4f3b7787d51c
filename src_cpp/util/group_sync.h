// SPDX-License-Identifier: Apache-2.0
// GroupSync: group commit of a device's flush (fdatasync). Callers of
// sync() share flushes instead of each running its own: with W store
// workers ending their slices at once, fewer fdatasyncs than W
// (docs/card_format.md, "Durability").
//
// The guarantee is the one a flush of its own gives: sync() returns the
// result of a flush that began after every write the caller completed
// before calling. The device counts its completed writes (wrote(), after
// each write returns); a flush notes the count when it begins, and covers a
// caller when that count is at least the one the caller saw when it called.
// A caller joins the flush running now if it covers it (every write the
// caller knows of was done before that flush began: two workers whose
// writes finish together share one fdatasync), else the next one, which
// begins when the running one ends and serves every caller that came
// meanwhile. A failed flush fails every caller it was to cover, and no
// other: a caller is never answered by a later flush that succeeded (after
// a failed fdatasync the kernel may have dropped the dirty pages, and a
// later one succeeds without them).
//
// Thread-safe. One flush at a time, run by one of its callers (the leader)
// outside the lock; the others wait.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "util/status.h"

namespace adp {

class GroupSync {
 public:
  using Flush = std::function<Status()>;

  // A write to the device completed (called after it returned, failed or
  // not): a flush that begins from now on covers it.
  void wrote() { written_.fetch_add(1, std::memory_order_acq_rel); }

  // Returns the result of a run of `flush` that began after every write
  // completed (wrote()) before this call: one running now that began after
  // them, or the next. `flush` must be the same operation for every caller
  // (the device's). With `number`, the flush's number (1 for the first).
  Status sync(const Flush& flush, uint64_t* number = nullptr);

  // The flushes run so far (started, finished or not); callers waiting for
  // one now (for tests: a round is whole when all its callers wait).
  uint64_t flushes() const;
  int waiting() const;

 private:
  // One flush and the callers it covers: they hold the round, so each reads
  // its own flush's result however late it wakes.
  struct Round {
    uint64_t number = 0;  // set when its flush begins
    uint64_t covers = 0;  // the writes completed when it began (written_)
    bool done = false;
    Status status;
  };

  std::atomic<uint64_t> written_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Round> running_;  // the flush in progress, or null
  std::shared_ptr<Round> next_;     // the round that begins when it ends: callers it did not cover
  uint64_t started_ = 0;
  int waiting_ = 0;
};

}  // namespace adp
