// SPDX-License-Identifier: Apache-2.0
// spin_poll (util/idle_cpus.h), the poll without sleep of --request-spin-us
// and reply_spin_us: a signal that interrupts one of its polls (EINTR) does
// not end the spin as if the socket were in error (review r14a N4: it
// returned POLLERR, and the connector then read its reply with no look at
// the stall); the spin still ends when the socket turns readable, or at its
// end with nothing (0).
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "check.h"
#include "util/idle_cpus.h"

namespace {

using Clock = std::chrono::steady_clock;

void on_signal(int) {}

}  // namespace

int main() {
  // A handler (no SA_RESTART, as Python installs its own): a signal that lands in a poll makes it fail EINTR.
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  int sv[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");

  // Nothing to read: the spin lasts its whole 300 ms though the spinning thread takes a signal every 200 us.
  std::atomic<bool> spinning{true};
  short ev = -1;
  auto started = Clock::now();
  Clock::duration took{};
  std::thread spinner([&] {
    ev = adp::spin_poll(sv[0], Clock::now() + std::chrono::milliseconds(300));
    took = Clock::now() - started;
    spinning = false;
  });
  int sent = 0;
  while (spinning) {
    ::pthread_kill(spinner.native_handle(), SIGUSR1);
    sent++;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  spinner.join();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  CHECK(ev == 0, "nothing readable, %d signals: spin_poll returned revents %d after %lld ms, not 0 at its end", sent,
        ev, static_cast<long long>(ms));
  CHECK(ms >= 290, "the spin ended after %lld ms, before its 300", static_cast<long long>(ms));

  // Readable: returned at once with POLLIN, signals or not.
  CHECK(::write(sv[1], "x", 1) == 1, "write");
  ev = adp::spin_poll(sv[0], Clock::now() + std::chrono::milliseconds(300));
  CHECK(ev & POLLIN, "readable: revents %d", ev);
  // Hung up: POLLHUP (the read tells), not 0.
  char c;
  CHECK(::read(sv[0], &c, 1) == 1, "read");
  ::close(sv[1]);
  ev = adp::spin_poll(sv[0], Clock::now() + std::chrono::milliseconds(300));
  CHECK(ev & (POLLHUP | POLLIN), "hung up: revents %d", ev);
  ::close(sv[0]);
  return adp::testing::finish("spin_poll_test");
}
