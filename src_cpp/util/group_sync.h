// SPDX-License-Identifier: Apache-2.0
// GroupSync: group commit of a device's flush (fdatasync). Threads that call
// sync() while a flush runs share the next one instead of each running its
// own: with W store workers ending their slices at once, one fdatasync
// where there were W (docs/card_format.md, "Durability").
//
// The guarantee is the one a flush of its own gives: sync() returns the
// result of a flush that began after the call, so it covers every write the
// caller completed before calling. A failed flush fails every caller it was
// to cover, and no other: a caller is never answered by a later flush that
// succeeded (after a failed fdatasync the kernel may have dropped the dirty
// pages, and a later one succeeds without them).
//
// Thread-safe. One flush at a time, run by one of its callers (the leader)
// outside the lock; the others wait. The classic scheme (as PostgreSQL's
// WAL flush or a database's group commit): a round is the callers that
// came while the previous flush ran; its flush begins when that one ends.
#pragma once

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

  // Returns the result of a run of `flush` that began after this call: this
  // caller's own, or one it shared with the callers of the same round.
  // `flush` must be the same operation for every caller (the device's).
  // With `number`, the flush's number (1 for the first this object ran).
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
    bool done = false;
    Status status;
  };

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Round> running_;  // the flush in progress, or null
  std::shared_ptr<Round> next_;     // the round that begins when it ends: callers that came meanwhile
  uint64_t started_ = 0;
  int waiting_ = 0;
};

}  // namespace adp
