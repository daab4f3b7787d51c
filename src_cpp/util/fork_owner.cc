// SPDX-License-Identifier: Apache-2.0
#include "util/fork_owner.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace adp {

namespace {
std::atomic<uint64_t> g_forks{0};
}  // namespace

uint64_t fork_count() {
  static const int registered =
      ::pthread_atfork(nullptr, nullptr, [] { g_forks.fetch_add(1, std::memory_order_relaxed); });
  // It fails only without memory (ENOMEM): then no child is told from its parent.
  (void)registered;
  return g_forks.load(std::memory_order_relaxed);
}

ForkOwner::ForkOwner() : pid_(::getpid()), forks_(fork_count()) {}

}  // namespace adp
