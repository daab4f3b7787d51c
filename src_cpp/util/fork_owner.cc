// SPDX-License-Identifier: Apache-2.0
#include "util/fork_owner.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace adp {

namespace detail {
std::atomic<uint64_t> g_forks{0};
}  // namespace detail

namespace {
// Registered as the library is loaded (before any fork it could count). It fails only without memory (ENOMEM): then
// no child is told from its parent.
[[maybe_unused]] const int g_fork_counted =
    ::pthread_atfork(nullptr, nullptr, [] { detail::g_forks.fetch_add(1, std::memory_order_relaxed); });

struct Released {
  int fd;
  void* map;
  size_t map_bytes;
};

// What fork_release registered. Leaked (never destroyed): a fork during static destruction still finds it.
struct ReleasedList {
  std::mutex mu;
  std::vector<Released> list;
};

ReleasedList& released() {
  static ReleasedList* const r = [] {
    auto* l = new ReleasedList;
    // The prepare handler takes the lock (a thread registering at the fork finishes first), the parent's and the
    // child's give it back; the child's replaces each descriptor and mapping first (open, dup3, mmap, close: system
    // calls only). It fails only without memory (ENOMEM): then a child keeps the descriptors, as before.
    (void)::pthread_atfork([] { released().mu.lock(); }, [] { released().mu.unlock(); },
                           [] {
                             ReleasedList& r = released();
                             const int none = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
                             for (const Released& e : r.list) {
                               if (none >= 0) (void)::dup3(none, e.fd, O_CLOEXEC);
                               if (e.map)
                                 (void)::mmap(e.map, e.map_bytes, PROT_NONE,
                                              MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                             }
                             if (none >= 0) ::close(none);
                             r.mu.unlock();
                           });
    return l;
  }();
  return *r;
}
}  // namespace

ForkOwner::ForkOwner() : pid_(::getpid()), forks_(fork_count()) {}

void fork_release(int fd, void* map, size_t map_bytes) {
  ReleasedList& r = released();
  std::lock_guard<std::mutex> lock(r.mu);
  r.list.push_back({fd, map, map_bytes});
}

void fork_release_forget(int fd) {
  ReleasedList& r = released();
  std::lock_guard<std::mutex> lock(r.mu);
  r.list.erase(std::remove_if(r.list.begin(), r.list.end(), [fd](const Released& e) { return e.fd == fd; }),
               r.list.end());
}

}  // namespace adp
