// SPDX-License-Identifier: Apache-2.0
// IdleCpus: the load rule of a thread that spins instead of sleeping, shared
// by the gateway's --request-spin-us (a connection looking for its client's
// next request) and the connector's reply_spin_us (a worker looking for its
// gateway's reply): spin only while the machine runs at most half as many
// threads as there are CPUs (/proc/loadavg's runnable count, the reader
// included), so that a CPU spun on is idle otherwise, not taken from the
// peer or from other work on the host. The count is read again once
// `every_ns` has passed, by whichever thread asks first; the others use the
// last answer. Tests name another file and interval (ADP_TEST_LOADAVG_FILE,
// ADP_TEST_SPIN_LOAD_EVERY_MS).
#pragma once

#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace adp {

// How often the runnable threads are read again by default.
inline constexpr std::chrono::nanoseconds kIdleCpusEvery{10'000'000};

struct IdleCpus {
  std::string path = "/proc/loadavg";
  int64_t every_ns = kIdleCpusEvery.count();
  int cpus = 1;  // the CPUs the rule counts (PiecePool::usable_cpus: a container's quota counted)
  std::atomic<int64_t> read_ns{0};
  std::atomic<bool> ok{false};

  // Whether 2 x (runnable threads - own) <= cpus at the last read. `own`:
  // the caller's threads spinning under this rule as it reads (runnable
  // because they spin: not held against it; the gateway passes 0).
  bool idle(int own = 0) {
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    int64_t at = read_ns.load(std::memory_order_relaxed);
    if (now - at < every_ns || !read_ns.compare_exchange_strong(at, now)) return ok.load(std::memory_order_relaxed);
    bool idle_now = false;
    if (FILE* f = std::fopen(path.c_str(), "re")) {
      double l1, l5, l15;
      int running = 0, total = 0;
      idle_now =
          std::fscanf(f, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) == 5 && 2 * (running - own) <= cpus;
      std::fclose(f);
    }
    ok.store(idle_now, std::memory_order_relaxed);
    return idle_now;
  }

  // The whole rule for a side with `connections` (each a thread on either
  // side of the socket: connections x 2 <= cpus) and `own` threads spinning.
  bool allows(int64_t connections, int own = 0) { return 2 * connections <= cpus && idle(own); }
};

// Polls fd without sleeping until it is readable, hung up or in error (its
// revents) or `until` passes (0). A poll a signal interrupts (EINTR) is not
// an error: the spin goes on (review r14a N4).
inline short spin_poll(int fd, std::chrono::steady_clock::time_point until) {
  do {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, 0);
    if (r > 0) return p.revents;
    if (r < 0 && errno != EINTR) return POLLERR;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  } while (std::chrono::steady_clock::now() < until);
  return 0;
}

}  // namespace adp
