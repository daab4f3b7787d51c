// SPDX-License-Identifier: Apache-2.0
// A child forked while a thread of its parent is inside a log line logs and exits (fork40 item 2): util/log.cc's
// lock of a line had no fork handler, so a thread holding it at the fork left it locked in the child for ever, and
// the child's first line (the connector's, the AIO writer's forked-child line) waited for good.
//
// Two threads log lines in a loop (stderr: /dev/null, so a line is short and the lock held most of the time) while
// the main thread forks kForks children one after the other; each child logs one line and _exit(0)s. The parent
// waits for each up to kBound (polled); a child not gone by then is counted hung and killed (SIGKILL). Passes when
// every child exited 0 in time. Argument: the number of forks (default kForks).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "util/log.h"

using adp::testing::check;

namespace {
constexpr int kForks = 300;
constexpr auto kBound = std::chrono::seconds(20);  // a hang, not a slow child: a child takes milliseconds
}  // namespace

int main(int argc, char** argv) {
  const int forks = argc > 1 ? std::atoi(argv[1]) : kForks;
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  check(null >= 0 && ::dup2(null, 2) == 2, "stderr goes to /dev/null");
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lines{0};
  std::vector<std::thread> loggers;
  for (int t = 0; t < 2; t++)
    loggers.emplace_back([&, t] {
      while (!stop.load(std::memory_order_relaxed)) {
        ADP_ERROR("log_fork_test: thread %d, line %llu", t, static_cast<unsigned long long>(lines.fetch_add(1)));
      }
    });
  while (lines.load() < 100) std::this_thread::yield();
  int hung = 0, failed = 0;
  for (int i = 0; i < forks; i++) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ADP_ERROR("log_fork_test: child %d", i);
      ::_exit(0);
    }
    check(pid > 0, "fork " + std::to_string(i));
    if (pid < 0) break;
    const auto give_up = std::chrono::steady_clock::now() + kBound;
    int status = 0;
    pid_t r;
    while ((r = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (r == 0) {
      hung++;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    } else if (r != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failed++;
    }
  }
  stop = true;
  for (auto& t : loggers) t.join();
  std::printf(
      "log_fork_test: %d forks, %d children hung in their log line (killed after %lld s), %d failed; "
      "%llu lines of the threads\n",
      forks, hung, static_cast<long long>(kBound.count()), failed, static_cast<unsigned long long>(lines.load()));
  check(hung == 0, std::to_string(hung) + " children hung (their first log line waited for a lock of the parent's)");
  check(failed == 0, std::to_string(failed) + " children did not exit 0");
  return adp::testing::finish("log_fork_test");
}
