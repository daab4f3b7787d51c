// SPDX-License-Identifier: Apache-2.0
// AlignedBuffer: page-aligned, pre-faulted memory for O_DIRECT staging.
// Grows only (amortised by doubling) so a worker allocates a few times at
// warm-up and never on the hot path afterwards. Owned by one thread.
//
// A buffer made with huge_pages = true is 2 MiB aligned, a multiple of 2 MiB,
// and advised MADV_HUGEPAGE before its pages are touched: where the kernel has
// transparent huge pages ("always" or "madvise"), it is physically contiguous
// in 2 MiB pieces. An O_DIRECT read into it is then a handful of segments (one
// a 2 MiB page) instead of one a 4 KiB page: on this VM's virtio disk a read
// into scattered 4 KiB pages ran at about half the speed of one into huge
// pages at 256 KiB (one request either way), and a 2 MiB read into them was
// split into up to 4 requests (the queue's max_segments is 254; probe
// benchmarks/probes/l1_dest.py, benchmarks/results/2026-12-04-*-diskload.md).
// Without huge pages the buffer is as one made without the advice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace adp {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(bool huge_pages) : huge_(huge_pages) {}
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
  bool huge_pages() const { return huge_; }
  // Trades memory with o (no copy); each keeps its huge_pages() (how it grows).
  void swap(AlignedBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(cap_, o.cap_);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t cap_ = 0;
  bool huge_ = false;
};

}  // namespace adp
