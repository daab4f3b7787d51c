// SPDX-License-Identifier: Apache-2.0
#include "util/crc_worker.h"

#include <exception>

#include "util/crc32c.h"
#include "util/thread_name.h"

namespace adp {

CrcWorker::~CrcWorker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CrcWorker::start(const void* data, size_t n) { start_copy(nullptr, data, n); }

void CrcWorker::start_copy(void* dst, const void* data, size_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    dst_ = dst;
    data_ = data;
    n_ = n;
    pending_ = true;
    done_ = false;
  }
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::exception&) {
      // No thread (std::system_error: a pids limit, memory; std::bad_alloc: its state): the caller's thread computes
      // it now, and wait() returns it. Thrown, the exception ended the gateway (std::terminate on a connection's
      // thread) at a context's first large store.
      const uint32_t crc = dst ? crc32c_copy(dst, data, n) : crc32c(data, n);
      std::lock_guard<std::mutex> lock(mu_);
      pending_ = false;
      crc_ = crc;
      done_ = true;
      return;
    }
  }
  cv_.notify_all();
}

uint32_t CrcWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  done_ = false;
  return crc_;
}

void CrcWorker::run() {
  set_thread_name("adp-crc");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return pending_ || stop_; });
    if (stop_) return;
    pending_ = false;
    const void* data = data_;
    void* dst = dst_;
    size_t n = n_;
    lock.unlock();
    uint32_t crc = dst ? crc32c_copy(dst, data, n) : crc32c(data, n);
    lock.lock();
    crc_ = crc;
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace adp
