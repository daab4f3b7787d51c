// SPDX-License-Identifier: Apache-2.0
#include "util/populate.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "util/log.h"

namespace adp {
namespace {

enum : int { kUnknown, kWorks, kRefused };
// What this kernel answered to MADV_POPULATE_WRITE; kUnknown until asked.
std::atomic<int> g_kernel{kUnknown};
std::atomic<bool> g_refuse_for_test{false};

// Asks the kernel once whether it knows MADV_POPULATE_WRITE: with length 0
// madvise checks the advice and the address's alignment, then returns 0
// without looking at the range (Linux 5.14 on); a kernel before 5.14 fails
// it as EINVAL. Threads that race here may each ask; one logs the refusal.
bool kernel_refuses(void* p) {
  const int known = g_kernel.load(std::memory_order_acquire);
  if (known != kUnknown) return known == kRefused;
  bool refused;
  if (g_refuse_for_test.load(std::memory_order_relaxed)) {
    ADP_INFO("test hook ADP_TEST_SEGMENT_POPULATE_EINVAL: MADV_POPULATE_WRITE fails as EINVAL, not made");
    refused = true;
  } else {
    static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    void* aligned = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~(page - 1));
    refused = ::madvise(aligned, 0, MADV_POPULATE_WRITE) != 0 && errno == EINVAL;
  }
  int expected = kUnknown;
  if (g_kernel.compare_exchange_strong(expected, refused ? kRefused : kWorks, std::memory_order_acq_rel) && refused)
    ADP_WARN(
        "this kernel refuses MADV_POPULATE_WRITE (EINVAL; Linux before 5.14): loads into client segments fault "
        "their pages in as they copy, and stores into a card on tmpfs are written with pwritev instead of "
        "copied into its mapping; the call is not tried again");
  return refused;
}

}  // namespace

bool populate_refused(void* p) { return kernel_refuses(p); }

bool populate_write(void* p, size_t n) {
  if (kernel_refuses(p)) {
    errno = EINVAL;
    return false;
  }
  return ::madvise(p, n, MADV_POPULATE_WRITE) == 0;
}

void refuse_populate_for_test() {
  g_refuse_for_test.store(true);
  g_kernel.store(kUnknown);  // asked again, and refused
}

}  // namespace adp
