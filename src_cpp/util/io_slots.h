// SPDX-License-Identifier: Apache-2.0
// IoSlots: the card's I/O slots (CardDevice::set_io_depth): each read or
// write takes one for its syscall, so that no more than the card's queue
// depth are in flight, and gives it back after.
//
// Not a std::counting_semaphore: libstdc++'s (GCC 12) release makes a futex
// wake syscall whenever the count it raises was 0, whether a thread waits or
// not (its notify is "bare": it keeps no count of waiters). At full depth,
// which is where a loaded card runs (the embedded connector opens it with
// io_depth = num_workers, every worker reading), that was a syscall for
// nearly every read: load36's strace of 256 KiB loads, 2 workers, counted
// one FUTEX_WAKE (woke 0) after each preadv. Here a release wakes a thread
// only where one waits; an acquire with a slot free takes it under the lock
// (held for a few instructions), and nothing else.
#pragma once

#include <condition_variable>
#include <mutex>

namespace adp {

class IoSlots {
 public:
  explicit IoSlots(int slots) : free_(slots) {}
  IoSlots(const IoSlots&) = delete;
  IoSlots& operator=(const IoSlots&) = delete;

  void acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    if (free_ == 0) {
      waiting_++;
      freed_.wait(lock, [this] { return free_ > 0; });
      waiting_--;
    }
    free_--;
  }
  void release() {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_++;
      wake = waiting_ > 0;
    }
    if (wake) freed_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable freed_;
  int free_;         // slots free
  int waiting_ = 0;  // threads in acquire() waiting for one
};

}  // namespace adp
