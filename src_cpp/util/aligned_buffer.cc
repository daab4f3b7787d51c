// SPDX-License-Identifier: Apache-2.0
#include "util/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdint>

namespace adp {
namespace {

constexpr size_t kHugePage = 2u << 20;

// cap bytes (a multiple of kHugePage) at a kHugePage boundary, advised
// MADV_HUGEPAGE, then every page touched (one fault a huge page where the
// kernel gives one); nullptr if no memory. The advice may fail (a kernel
// without THP): the memory is then as MAP_POPULATE gives it.
void* map_huge(size_t cap) {
  void* p = mmap(nullptr, cap + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const uintptr_t at = reinterpret_cast<uintptr_t>(p), start = (at + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  if (start > at) munmap(p, start - at);
  munmap(reinterpret_cast<void*>(start + cap), at + kHugePage - start);
  auto* b = reinterpret_cast<uint8_t*>(start);
  madvise(b, cap, MADV_HUGEPAGE);
  for (size_t i = 0; i < cap; i += 4096) b[i] = 0;
  return b;
}

}  // namespace

AlignedBuffer::~AlignedBuffer() {
  if (data_) munmap(data_, cap_);
}

bool AlignedBuffer::reserve(size_t n) {
  if (n <= cap_) return true;
  size_t cap = cap_ ? cap_ : huge_ ? kHugePage : (1u << 20);
  while (cap < n) cap *= 2;
  return reserve_exact(cap);
}

bool AlignedBuffer::reserve_exact(size_t n) {
  if (n <= cap_) return true;
  const size_t unit = huge_ ? kHugePage : 4096;
  const size_t cap = (n + unit - 1) & ~(unit - 1);
  // Every page is touched now (MAP_POPULATE, or map_huge's loop): first-touch
  // faults are slow on these VMs and must not land on an I/O path.
  void* p = huge_ ? map_huge(cap)
                  : mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == nullptr || p == MAP_FAILED) return false;
  if (data_) munmap(data_, cap_);
  data_ = static_cast<uint8_t*>(p);
  cap_ = cap;
  return true;
}

}  // namespace adp
