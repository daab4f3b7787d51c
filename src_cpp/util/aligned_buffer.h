// SPDX-License-Identifier: Apache-2.0
// AlignedBuffer: page-aligned, pre-faulted memory for O_DIRECT staging.
// Grows only (amortised by doubling) so a worker allocates a few times at
// warm-up and never on the hot path afterwards. Owned by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace adp {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Ensures capacity >= n bytes; contents are not preserved on growth.
  // Returns false when memory cannot be mapped.
  bool reserve(size_t n);
  // Ensures capacity >= n bytes, mapping exactly n (rounded up to a page)
  // where it grows: no doubling, for a buffer held to a budget.
  bool reserve_exact(size_t n);
  uint8_t* data() const { return data_; }
  size_t capacity() const { return cap_; }
  // Trades memory with o (no copy).
  void swap(AlignedBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(cap_, o.cap_);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace adp
