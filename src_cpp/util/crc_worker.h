// SPDX-License-Identifier: Apache-2.0
// CrcWorker: computes one CRC32C on a thread of its own while its owner does
// something else (a store writes an object's body to a disk card while its
// checksum is computed; the header, which carries the checksum, goes last).
// The thread starts on first use and lives as long as the worker. Owned by
// one thread: start() and wait() are called in pairs by the owner.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

namespace adp {

class CrcWorker {
 public:
  CrcWorker() = default;
  ~CrcWorker();
  CrcWorker(const CrcWorker&) = delete;
  CrcWorker& operator=(const CrcWorker&) = delete;

  // Starts the CRC32C of [data, data + n): the memory must stay valid and
  // unchanged until wait() returns. Must not be called again before wait().
  void start(const void* data, size_t n);
  // The same, copying the bytes to dst in the same pass (crc32c_copy): dst
  // is written until wait() returns.
  void start_copy(void* dst, const void* data, size_t n);
  // Waits for the CRC started last and returns it.
  uint32_t wait();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  const void* data_ = nullptr;
  void* dst_ = nullptr;  // start_copy's
  size_t n_ = 0;
  uint32_t crc_ = 0;
  bool pending_ = false, done_ = false, stop_ = false;
};

}  // namespace adp
