// SPDX-License-Identifier: Apache-2.0
// A test program's own operator new, whose allocation failures (std::bad_alloc) the program injects: the next
// allocation on the calling thread throws, or the one after a given count (fail_after), or one the program's own
// alloc_fault_due() says (thread_alloc_test.cc: the one after a count on a named thread). Defines the replaceable
// operator new and delete: included by one translation unit of a program, the test's own (thread_alloc_test.cc,
// put_slices_memory_test.cc), which defines alloc_fault_due().
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace adp::testing {
// The allocations on this thread to let through before one throws; -1: none throws (and once it has thrown).
inline thread_local int fail_after = -1;
// Whether this allocation is one more to throw, beside fail_after's (defined by the program).
bool alloc_fault_due();
}  // namespace adp::testing

void* operator new(std::size_t n) {
  int& k = adp::testing::fail_after;
  if (k == 0) {
    k = -1;
    throw std::bad_alloc();
  }
  if (k > 0) k--;
  if (adp::testing::alloc_fault_due()) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// Not inlined: GCC pairs an inlined delete's free() with the new-expression's operator new and warns (mismatched).
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }
