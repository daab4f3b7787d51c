// SPDX-License-Identifier: Apache-2.0
#include "protocol/client_segment.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

namespace adp::proto {
namespace {

// The mapped segments, read by the SIGBUS handler (lock-free: atomics only).
// A slot is taken by a mapping and given back when it is unmapped.
constexpr int kSlots = 4096;
struct Slot {
  std::atomic<uintptr_t> lo{0}, hi{0};
  std::atomic<bool> broken{false};
  std::atomic<bool> used{false};
};
Slot g_slots[kSlots];
struct sigaction g_previous;
std::once_flag g_installed;

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& s : g_slots) {
    uintptr_t lo = s.lo.load(std::memory_order_acquire), hi = s.hi.load(std::memory_order_acquire);
    if (lo == 0 || addr < lo || addr >= hi) continue;
    // The client shrank its file: anonymous memory over the rest of the
    // segment lets the faulting access (and any after it) complete.
    uintptr_t page = addr & ~uintptr_t(4095);
    long r = syscall(SYS_mmap, page, hi - page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (r == -1) break;  // cannot repair: fall through to the previous disposition
    s.broken.store(true, std::memory_order_release);
    return;
  }
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, uctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  // Default action: restore it; returning re-runs the access, which faults again and ends the process.
  signal(SIGBUS, SIG_DFL);
}

void install_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

int take_slot(uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < kSlots; i++) {
    bool expected = false;
    if (!g_slots[i].used.compare_exchange_strong(expected, true)) continue;
    g_slots[i].broken.store(false);
    g_slots[i].hi.store(hi, std::memory_order_release);
    g_slots[i].lo.store(lo, std::memory_order_release);
    return i;
  }
  return -1;
}

}  // namespace

Status ClientSegment::Attach(int fd, uint64_t bytes, std::unique_ptr<ClientSegment>* out) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes) {
    ::close(fd);
    return Status::InvalidArgument("segment descriptor is not a regular file of the stated size");
  }
  std::call_once(g_installed, install_handler);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return Status::InvalidArgument("cannot map the segment: " + errno_text(err));
  }
  uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  int slot = take_slot(lo, lo + bytes);
  if (slot < 0) {
    ::munmap(p, bytes);
    ::close(fd);
    return Status::Busy("too many segments mapped in this gateway");
  }
  out->reset(new ClientSegment(fd, static_cast<uint8_t*>(p), bytes, slot));
  return Status::Ok();
}

bool ClientSegment::broken() const { return g_slots[slot_].broken.load(std::memory_order_acquire); }

ClientSegment::~ClientSegment() {
  Slot& s = g_slots[slot_];
  s.lo.store(0, std::memory_order_release);
  s.hi.store(0, std::memory_order_release);
  // Unmaps the file's pages and any anonymous memory laid over them.
  ::munmap(data_, size_);
  ::close(fd_);
  s.used.store(false, std::memory_order_release);
}

}  // namespace adp::proto
