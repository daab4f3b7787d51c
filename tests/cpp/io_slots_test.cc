// SPDX-License-Identifier: Apache-2.0
// CardDevice's I/O slots (set_io_depth; util/io_slots.h): a read gives its
// slot back without a wake-up syscall when no thread waits for one, and the
// depth still bounds the reads in flight. This program interposes libc's
// syscall() (the way libstdc++'s atomic waits and semaphores reach the
// futex: std::counting_semaphore's release did a FUTEX_WAKE for each read at
// full depth, woke or not, load36) and preadv (to hold reads in flight).
// Checks:
//   - at depth 1, 200 reads of one thread: no futex wake from it;
//   - at depth 2, four threads with one read each: at most 2 reads in
//     flight, 2 at once (reads are held in pairs, each until the other is
//     in), and all four done (the two that waited for a slot were woken).
//
//   io_slots_test DIR
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_device.h"

namespace {

thread_local bool t_counting = false;  // count this thread's futex wakes
std::atomic<int> futex_wakes{0};

// With `held` set, reads are held in preadv in pairs: read k until read k ^ 1 has come in too.
std::mutex hold_mu;
std::condition_variable hold_cv;
bool held = false;
int entered = 0, in_flight = 0, most_in_flight = 0, held_out = 0;  // held_out: holds that timed out

}  // namespace

extern "C" long syscall(long number, ...) noexcept {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& x : a) x = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_futex && t_counting && (a[1] & FUTEX_CMD_MASK) == FUTEX_WAKE) futex_wakes++;
  using Fn = long (*)(long, ...);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "syscall"));
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

extern "C" ssize_t preadv(int fd, const struct iovec* iov, int count, off_t offset) {
  using Fn = ssize_t (*)(int, const struct iovec*, int, off_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "preadv"));
  {
    std::unique_lock<std::mutex> lock(hold_mu);
    const int pair_in = (entered / 2 + 1) * 2;  // reads entered once this one's pair has
    entered++;
    in_flight++;
    most_in_flight = std::max(most_in_flight, in_flight);
    hold_cv.notify_all();
    if (held && !hold_cv.wait_for(lock, std::chrono::seconds(20), [&] { return entered >= pair_in; })) held_out++;
  }
  const ssize_t n = real(fd, iov, count, offset);
  std::lock_guard<std::mutex> lock(hold_mu);
  in_flight--;
  return n;
}

int main(int argc, char** argv) {
  using adp::testing::check;
  if (argc != 2) {
    std::fprintf(stderr, "usage: io_slots_test DIR\n");
    return 2;
  }
  const std::string path = std::string(argv[1]) + "/card.img";
  constexpr size_t kBlock = 4096;
  void* raw = nullptr;
  if (posix_memalign(&raw, kBlock, kBlock) != 0) return 2;
  std::unique_ptr<void, decltype(&std::free)> buf(raw, &std::free);
  {
    std::unique_ptr<adp::CardDevice> dev;
    adp::Status s = adp::CardDevice::Open(path, 64 * kBlock, &dev);
    check(s.ok(), "open: " + s.message());
    if (!s.ok()) return adp::testing::finish("io_slots_test");
    dev->set_io_depth(1);
    const iovec iov{buf.get(), kBlock};
    check(dev->writev(0, &iov, 1).ok(), "write block 0");
    t_counting = true;
    bool all_ok = true;
    for (int i = 0; i < 200; i++) all_ok = dev->readv(0, &iov, 1).ok() && all_ok;
    t_counting = false;
    check(all_ok, "200 reads at depth 1");
    check(futex_wakes == 0,
          "no futex wake for 200 reads at depth 1 with no waiter, got " + std::to_string(futex_wakes.load()));
  }
  {
    std::unique_ptr<adp::CardDevice> dev;
    adp::Status s = adp::CardDevice::Open(path, 64 * kBlock, &dev);
    check(s.ok(), "reopen: " + s.message());
    if (!s.ok()) return adp::testing::finish("io_slots_test");
    dev->set_io_depth(2);
    {
      std::lock_guard<std::mutex> lock(hold_mu);
      entered = most_in_flight = 0;
      held = true;
    }
    std::atomic<int> ok{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; t++)
      ts.emplace_back([&, t] {
        std::vector<uint8_t> mine(2 * kBlock);
        auto* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(mine.data()) + kBlock - 1) & ~(kBlock - 1));
        const iovec v{p, kBlock};
        if (dev->readv(kBlock * t, &v, 1).ok()) ok++;
      });
    for (auto& t : ts) t.join();
    std::lock_guard<std::mutex> lock(hold_mu);
    held = false;
    check(ok == 4, "four reads at depth 2: " + std::to_string(ok.load()) + " succeeded");
    check(most_in_flight == 2, "reads in flight at depth 2: at most " + std::to_string(most_in_flight));
    check(held_out == 0, std::to_string(held_out) + " reads waited 20 s for a second one in flight");
  }
  ::unlink(path.c_str());
  return adp::testing::finish("io_slots_test");
}
