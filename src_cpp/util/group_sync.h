// SPDX-License-Identifier: Apache-2.0
// GroupSync: group commit of a device's flush (fdatasync). Callers of
// sync() share flushes instead of each running its own: with W store
// workers ending their slices at once, fewer fdatasyncs than W
// (docs/card_format.md, "Writing").
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
// meanwhile. A failed flush fails every caller it was to cover, and a
// caller is never answered by a later flush that succeeded (after a failed
// fdatasync the kernel may have dropped the dirty pages, and a later one
// succeeds without them).
//
// Nor is a caller answered Ok where a failed flush may have dropped a write
// it depends on (sessions 31, 32): a failed flush may lose, for good, every
// write the device had taken before it returned (a device whose cache flush
// failed, a device reset; the kernel dropping the dirty pages), and the next
// flush, which succeeds, does not bring them back. That is more than the
// writes completed when it began: fdatasync sends the device its cache FLUSH
// only after waiting on the page cache, so a write that completes in between
// sits in the cache that FLUSH fails on; and a write whose syscall returned
// before the flush began may not be counted yet (its thread between the
// syscall and wrote()). So the device also counts the writes it *issues*
// (issue(), before each write's syscall): a caller passes `since`, that count
// (mark()) noted before its first write, or before the first write it
// depends on (a card store: the region it writes in was opened after it);
// a failed flush keeps as `lost` the count of writes issued when it
// returned; a caller is failed where a flush that answers it began after a
// failed flush whose `lost` is above `since` (a write issued after its mark
// was issued before that failed flush returned: it may be lost). So a
// caller is answered Ok only if no failed flush could have dropped any write
// issued after its mark. A caller whose writes were all issued after the
// failed flush returned is answered as usual. A caller failed needlessly
// (its writes were made durable by a successful flush before the failed one
// began; another thread issued a write after its mark and before the
// failure) is safe: the store is not acknowledged. Covering stays on
// completed writes (wrote()): a flush covers a write only once it returned.
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
#include <string>

#include "util/status.h"

namespace adp {

class GroupSync {
 public:
  using Flush = std::function<Status()>;

  // `device` names the device in the answer sync() makes itself (an
  // earlier flush failed): the flush's own failures name it already.
  explicit GroupSync(std::string device = "the device") : device_(std::move(device)) {}

  // A write to the device is about to be issued (called before its
  // syscall; every write, whatever its result): a flush that fails from now
  // on may lose it. One atomic add, no lock.
  void issue() { issued_.fetch_add(1, std::memory_order_acq_rel); }
  // A write to the device completed (called after it returned, failed or
  // not; issue() was called before it): a flush that begins from now on
  // covers it.
  void wrote() { written_.fetch_add(1, std::memory_order_acq_rel); }
  // The writes issued so far: a caller notes it before its first write,
  // and passes it to sync() as `since`.
  uint64_t mark() const { return issued_.load(std::memory_order_acquire); }
  // True when a failed flush returned after a write issued after `since`
  // (mark()) was issued: that write may be lost for good. One atomic load (a
  // card store asks it at each reservation, of its frontier region's mark).
  bool lost_after(uint64_t since) const { return lost_.load(std::memory_order_acquire) > since; }

  // Returns the result of a run of `flush` that began after every write
  // completed (wrote()) before this call: one running now that began after
  // them, or the next. `flush` must be the same operation for every caller
  // (the device's). A success is an IoError instead where a failed flush
  // that returned before it began returned after a write issued after
  // `since` (mark() noted before the caller's first write) was issued: that
  // write may be lost.
  // With `number`, the flush's number (1 for the first).
  Status sync(const Flush& flush, uint64_t since, uint64_t* number = nullptr);

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
    uint64_t lost = 0;    // when it began, the lost_ of the latest failed flush
    bool done = false;
    Status status;
  };

  const std::string device_;
  std::atomic<uint64_t> issued_{0};   // issue(): marks and lost_ count these
  std::atomic<uint64_t> written_{0};  // wrote(): covers count these
  // The writes issued when the latest failed flush returned (0: none failed):
  // those no successful flush had covered may be lost. Written under mu_ by
  // a failed flush's leader, read by lost_after() without it.
  std::atomic<uint64_t> lost_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Round> running_;  // the flush in progress, or null
  std::shared_ptr<Round> next_;     // the round that begins when it ends: callers it did not cover
  uint64_t started_ = 0;
  int waiting_ = 0;
};

}  // namespace adp
