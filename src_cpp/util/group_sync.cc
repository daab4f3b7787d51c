// SPDX-License-Identifier: Apache-2.0
#include "util/group_sync.h"

namespace adp {

Status GroupSync::sync(const Flush& flush, uint64_t* number) {
  std::unique_lock<std::mutex> l(mu_);
  // Join the round whose flush has not begun (a flush running now may have
  // begun before this caller's writes completed: it does not count).
  if (!next_) next_ = std::make_shared<Round>();
  const std::shared_ptr<Round> mine = next_;
  while (!mine->done) {
    if (!running_) {
      // Nothing runs, and this round's flush has not begun (only the round
      // that ran can be done): lead it.
      running_ = std::move(next_);
      mine->number = ++started_;
      l.unlock();
      Status s = flush();
      l.lock();
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
