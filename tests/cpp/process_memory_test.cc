// SPDX-License-Identifier: Apache-2.0
// ProcessMemory (src_cpp/protocol/process_memory.h) used by three threads at
// once, as a process load's pieces are (its connection's thread and two
// helpers), while the client's threads exit under it: first its main thread
// (every transfer meets ESRCH and names another thread), then, one by one,
// each thread named instead. Checks: every transfer while a thread of the
// client lives reads the client's bytes; the gateway's descriptors are its
// own pidfd and one thread pidfd at the end (none leaked by two transfers
// retargeting at once, none closed twice); once the process is gone a
// transfer says Closed. Under TSan (tests/sanitizers): no data race on the
// thread named. Review r7 B2. Built and run by
// tests/gateway/test_process_memory_threads.py.
// Each step waits for what it can see, not for time: a thread told to exit
// is waited for until /proc shows it gone (the main thread: a zombie
// leader), then for 30 more transfers (a loaded host ran them before the
// client's main thread was scheduled to exit: target() still named it).
#include "protocol/process_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

using namespace std::chrono_literals;

namespace {

constexpr int kThreads = 5;            // the client's threads besides its main thread
constexpr size_t kBytes = 1u << 20;    // read by each transfer
alignas(4096) uint8_t g_data[kBytes];  // the same address in the client (a fork)
alignas(64) uint8_t g_probe[64];       // the registration's probe
int g_pipes[kThreads + 1][2];          // a byte on [i] ends the client's thread i (kThreads: its main thread)
std::atomic<pid_t> g_tids[kThreads];   // in the client: its threads' ids, sent to the test once all are set

int open_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n - 1;  // the DIR's own
}

void* client_thread(void* arg) {
  const int i = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  g_tids[i] = static_cast<pid_t>(::syscall(SYS_gettid));
  char b;
  while (::read(g_pipes[i][0], &b, 1) < 0) {
  }
  if (i == kThreads - 1) ::_exit(0);  // the last one: the whole process
  return nullptr;
}

// The client: connects, starts its threads, sends their ids, and ends its
// threads (the main thread with a raw SYS_exit: the process lives on) as told.
[[noreturn]] void client(const sockaddr_un& addr, socklen_t len) {
  int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (::connect(s, reinterpret_cast<const sockaddr*>(&addr), len) != 0) ::_exit(2);
  for (int i = 0; i < kThreads; i++) {
    pthread_t t;
    if (pthread_create(&t, nullptr, client_thread, reinterpret_cast<void*>(static_cast<intptr_t>(i))) != 0) ::_exit(3);
    pthread_detach(t);
  }
  pid_t tids[kThreads];
  for (int i = 0; i < kThreads; i++) {
    while (g_tids[i].load() == 0) ::usleep(1000);
    tids[i] = g_tids[i].load();
  }
  if (::write(s, tids, sizeof tids) != static_cast<ssize_t>(sizeof tids)) ::_exit(4);
  char b;
  while (::read(g_pipes[kThreads][0], &b, 1) < 0) {
  }
  ::syscall(SYS_exit, 0);  // this thread only
  ::_exit(5);
}

// Whether thread tid of process pid has exited: its /proc entry is gone, or
// (the main thread, while others live) it is a zombie.
bool exited(pid_t pid, pid_t tid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return true;
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // "tid (comm) S ...": the state follows the last ')'
  return n == 0 || !paren || paren[1] == '\0' || paren[2] == 'Z' || paren[2] == 'X';
}

}  // namespace

int main() {
  for (size_t i = 0; i < kBytes; i++) g_data[i] = static_cast<uint8_t>(i * 31 + 7);
  for (size_t i = 0; i < sizeof g_probe; i++) g_probe[i] = static_cast<uint8_t>(i ^ 0x5a);
  for (auto& p : g_pipes) CHECK(::pipe(p) == 0, "pipe");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = "adp-pm-test-" + std::to_string(::getpid());
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract
  const socklen_t alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
  CHECK(::bind(listener, reinterpret_cast<sockaddr*>(&addr), alen) == 0 && ::listen(listener, 1) == 0, "listen");
  const pid_t child = ::fork();  // before any thread of this process
  if (child == 0) client(addr, alen);
  int sock = ::accept(listener, nullptr, nullptr);
  pid_t tids[kThreads];
  CHECK(::recv(sock, tids, sizeof tids, MSG_WAITALL) == static_cast<ssize_t>(sizeof tids),
        "the client's threads started");
  for (auto& p : g_pipes) ::close(p[0]);

  std::unique_ptr<adp::proto::ProcessMemory> pm;
  adp::Status s = adp::proto::ProcessMemory::Attach(
      sock, static_cast<uint32_t>(child), reinterpret_cast<uint64_t>(g_probe), {g_probe, sizeof g_probe}, &pm);
  CHECK(s.ok(), "attach: %s", s.message().c_str());
  if (!s.ok()) return 1;
  const int fds = open_fds();  // with the pidfd

  std::atomic<bool> stop{false};
  std::atomic<int> good{0}, bad{0};
  std::string first_bad;
  std::mutex bad_mu;
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; r++)
    readers.emplace_back([&] {
      std::vector<uint8_t> buf(kBytes);
      while (!stop.load()) {
        adp::Status st = pm->read(reinterpret_cast<uint64_t>(g_data), buf.data(), kBytes);
        if (st.ok() && std::memcmp(buf.data(), g_data, kBytes) == 0) {
          good++;
          continue;
        }
        bad++;
        std::lock_guard<std::mutex> l(bad_mu);
        if (first_bad.empty()) first_bad = st.ok() ? "other bytes" : st.message();
      }
    });
  auto pause = [&] {  // until the readers got through 30 more transfers (they fail the test if they fail)
    const int from = good.load();
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (good.load() < from + 30 && bad.load() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(2ms);
    CHECK(good.load() >= from + 30 || bad.load() > 0, "no 30 transfers within 60 s");
  };
  pause();
  // Ends the client's thread tid (pipe i) and waits until it has exited.
  auto end = [&](int i, pid_t tid) {
    CHECK(::write(g_pipes[i][1], "x", 1) == 1, "end thread %d", i);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!exited(child, tid) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    CHECK(exited(child, tid), "thread %d of the client still runs 60 s after it was told to exit", i);
  };
  end(kThreads, child);  // the main thread
  pause();               // transfers since it exited: each met ESRCH, or the thread one of them named
  CHECK(pm->target() != child, "a live thread is named instead of the exited main thread");
  for (int i = 0; i < kThreads - 1; i++) {  // the thread named (the first listed) exits, and so on
    end(i, tids[i]);
    pause();
    CHECK(pm->target() != tids[i], "thread %d (%d) exited and is still named", i, tids[i]);
  }
  stop = true;
  for (auto& t : readers) t.join();
  CHECK(bad.load() == 0, "%d of %d transfers failed while the client lived: %s", bad.load(), good.load() + bad.load(),
        first_bad.c_str());
  CHECK(good.load() > 100, "only %d transfers", good.load());
  CHECK(open_fds() == fds + 1, "%d descriptors, expected %d (the pidfd and one thread pidfd)", open_fds(), fds + 1);
  CHECK(::fcntl(sock, F_GETFD) >= 0 && ::fcntl(listener, F_GETFD) >= 0, "another descriptor was closed");

  end(kThreads - 1, tids[kThreads - 1]);  // the whole process
  int status = 0;
  ::waitpid(child, &status, 0);
  std::vector<uint8_t> buf(4096);
  s = pm->read(reinterpret_cast<uint64_t>(g_data), buf.data(), buf.size());
  CHECK(s.code() == adp::Status::Code::kClosed, "a transfer after the client exited: %s", s.message().c_str());
  CHECK(!pm->alive(), "alive after exit");
  pm.reset();
  CHECK(open_fds() == fds - 1, "%d descriptors after the ProcessMemory, expected %d", open_fds(), fds - 1);
  ::close(sock);
  ::close(listener);
  std::printf("process_memory_test: %d transfers\n", good.load());
  return adp::testing::finish("process_memory_test");
}
