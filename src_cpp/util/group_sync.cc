// SPDX-License-Identifier: Apache-2.0
#include "util/group_sync.h"

namespace adp {

Status GroupSync::sync(const Flush& flush, uint64_t since, uint64_t* number) {
  // The writes this caller must have flushed: every one completed so far.
  const uint64_t need = written_.load(std::memory_order_acquire);
  std::unique_lock<std::mutex> l(mu_);
  std::shared_ptr<Round> mine;
  if (running_ && running_->covers >= need) {
    mine = running_;  // it began after this caller's writes
  } else {
    if (!next_) next_ = std::make_shared<Round>();
    mine = next_;
  }
  while (!mine->done) {
    if (!running_) {
      // Nothing runs, and this round's flush has not begun (only a round
      // that ran can be done, and mine is not running): lead it.
      running_ = std::move(next_);
      mine->number = ++started_;
      mine->covers = written_.load(std::memory_order_acquire);
      mine->lost = lost_.load(std::memory_order_relaxed);
      l.unlock();
      Status s = flush();
      l.lock();
      // It may have dropped every write the device took before it returned:
      // those issued so far (issue() precedes the syscall, so a write that
      // completed during the flush, or before it began but is not counted as
      // completed yet, is among them). Flushes run one at a time and the
      // count grows: the latest failed one's is the largest.
      if (!s.ok()) lost_.store(issued_.load(std::memory_order_acquire), std::memory_order_release);
      mine->status = std::move(s);
      mine->done = true;
      running_.reset();
      cv_.notify_all();  // this round's callers, and the next round's leader
      break;
    }
    waiting_++;
    cv_.wait(l);
    waiting_--;
  }
  if (number) *number = mine->number;
  if (mine->status.ok() && mine->lost > since)
    return Status::IoError("an earlier sync of " + device_ +
                           " failed after this caller's writes began: they may be lost");
  return mine->status;
}

uint64_t GroupSync::flushes() const {
  std::lock_guard<std::mutex> l(mu_);
  return started_;
}

int GroupSync::waiting() const {
  std::lock_guard<std::mutex> l(mu_);
  return waiting_;
}

}  // namespace adp
