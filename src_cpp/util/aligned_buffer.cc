// SPDX-License-Identifier: Apache-2.0
#include "util/aligned_buffer.h"

#include <sys/mman.h>

namespace adp {

AlignedBuffer::~AlignedBuffer() {
  if (data_) munmap(data_, cap_);
}

bool AlignedBuffer::reserve(size_t n) {
  if (n <= cap_) return true;
  size_t cap = cap_ ? cap_ : (1u << 20);
  while (cap < n) cap *= 2;
  return reserve_exact(cap);
}

bool AlignedBuffer::reserve_exact(size_t n) {
  if (n <= cap_) return true;
  const size_t cap = (n + 4095) & ~size_t(4095);
  // MAP_POPULATE touches every page now: first-touch faults are slow on
  // these VMs and must not land on an I/O path.
  void* p = mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return false;
  if (data_) munmap(data_, cap_);
  data_ = static_cast<uint8_t*>(p);
  cap_ = cap;
  return true;
}

}  // namespace adp
