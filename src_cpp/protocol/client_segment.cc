// SPDX-License-Identifier: Apache-2.0
#include "protocol/client_segment.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "util/log.h"
#include "util/populate.h"

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

constexpr int kPageShift = 12;  // populated-ness is tracked per 4 KiB page

// The mappings in use, by file identity: a file registered again (by any
// connection) shares the mapping while its size is unchanged.
std::mutex g_mu;
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<SegmentMapping>> g_mappings;

}  // namespace

struct SegmentMapping {
  int fd = -1;
  uint8_t* data = nullptr;
  uint64_t size = 0;
  int slot = -1;
  std::pair<dev_t, ino_t> id;
  // One bit per 4 KiB page (1/32768 of the segment, against 1/512 for the
  // page tables that the populated pages cost anyway).
  std::unique_ptr<std::atomic<uint64_t>[]> populated;

  ~SegmentMapping() {
    {
      std::lock_guard<std::mutex> l(g_mu);
      auto it = g_mappings.find(id);
      if (it != g_mappings.end() && it->second.expired()) g_mappings.erase(it);
    }
    Slot& s = g_slots[slot];
    s.lo.store(0, std::memory_order_release);
    s.hi.store(0, std::memory_order_release);
    // Unmaps the file's pages and any anonymous memory laid over them.
    ::munmap(data, size);
    ::close(fd);
    s.used.store(false, std::memory_order_release);
  }
};

Status ClientSegment::Attach(int fd, uint64_t bytes, std::unique_ptr<ClientSegment>* out) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes) {
    ::close(fd);
    return Status::InvalidArgument("segment descriptor is not a regular file of the stated size");
  }
  std::call_once(g_installed, install_handler);
  const auto id = std::make_pair(st.st_dev, st.st_ino);
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_mappings.find(id);
  if (it != g_mappings.end()) {
    std::shared_ptr<SegmentMapping> m = it->second.lock();
    if (m && m->size == bytes && !g_slots[m->slot].broken.load()) {
      ::close(fd);  // this connection proved access; the mapping has an fd of its own
      out->reset(new ClientSegment(std::move(m)));
      return Status::Ok();
    }
  }
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
  auto m = std::make_shared<SegmentMapping>();
  m->fd = fd;
  m->data = static_cast<uint8_t*>(p);
  m->size = bytes;
  m->slot = slot;
  m->id = id;
  size_t words = ((bytes >> kPageShift) + 64) / 64;
  m->populated.reset(new std::atomic<uint64_t>[words]());
  g_mappings[id] = m;
  out->reset(new ClientSegment(std::move(m)));
  return Status::Ok();
}

ClientSegment::~ClientSegment() = default;
uint8_t* ClientSegment::data() const { return m_->data; }
uint64_t ClientSegment::size() const { return m_->size; }
bool ClientSegment::broken() const { return g_slots[m_->slot].broken.load(std::memory_order_acquire); }

bool ClientSegment::prepare(uint64_t offset, uint64_t len) {
  if (len == 0) return false;
  // Pages [first, last] hold the range; bits [first, last] of populated.
  const uint64_t first = offset >> kPageShift, last = (offset + len - 1) >> kPageShift;
  auto mask = [&](uint64_t w) {  // the bits of word w in [first, last]
    const uint64_t lo = std::max(first, w * 64), hi = std::min(last, w * 64 + 63);
    const uint64_t n = hi - lo + 1;
    return (n == 64 ? ~uint64_t(0) : ((uint64_t(1) << n) - 1)) << (lo % 64);
  };
  bool all = true;
  for (uint64_t w = first / 64; w <= last / 64 && all; w++)
    all = (m_->populated[w].load(std::memory_order_relaxed) & mask(w)) == mask(w);
  if (all) return false;
  uint64_t lo = first << kPageShift, hi = (last + 1) << kPageShift;
  if (hi > m_->size) hi = m_->size;
  // Refused by this kernel (util/populate.h): false, without a system call.
  if (!populate_write(m_->data + lo, hi - lo)) return false;
  // Its pages stay populated (the mapping is never unmapped in part).
  for (uint64_t w = first / 64; w <= last / 64; w++) m_->populated[w].fetch_or(mask(w), std::memory_order_relaxed);
  return true;
}

}  // namespace adp::proto
