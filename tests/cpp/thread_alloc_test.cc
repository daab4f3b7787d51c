// SPDX-License-Identifier: Apache-2.0
// A helper thread whose start fails for want of memory (std::bad_alloc from
// std::thread's own allocation of its state, before any clone) is done
// without, as one that fails with std::system_error is (a1eda4c, 2e31a25,
// tests/store/test_no_thread.py): the CRC worker computes the CRC on the
// caller's thread, a tmpfs card's prefault is skipped, a client segment is
// left to its loads and recovery walks with the threads it got. The failure is
// injected by this program's operator new: the next allocation made on the
// calling thread throws (or the one after a given count).
//
//   thread_alloc_test TMPFS_DIR
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "page_state.h"
#include "protocol/client_segment.h"
#include "store/card_device.h"
#include "store/recovery.h"
#include "util/crc32c.h"
#include "util/crc_worker.h"

namespace {
// The allocations on this thread to let through before one throws; -1: none throws (and once it has thrown).
thread_local int fail_after = -1;
}  // namespace

void* operator new(std::size_t n) {
  if (fail_after == 0) {
    fail_after = -1;
    throw std::bad_alloc();
  }
  if (fail_after > 0) fail_after--;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using adp::proto::ClientSegment;
using adp::proto::SegmentPrefaulter;

// start_copy's first allocation is its thread's state: it throws.
void crc_on_the_callers_thread() {
  const std::vector<uint8_t> data = adp::testing::pattern(2 << 20, 7);
  std::vector<uint8_t> copy(data.size());
  adp::CrcWorker w;
  fail_after = 0;
  try {
    w.start_copy(copy.data(), data.data(), data.size());
  } catch (const std::bad_alloc&) {
    CHECK(false, "CrcWorker::start_copy threw std::bad_alloc");
    return;
  }
  CHECK(fail_after == -1, "start_copy allocated nothing: no failure injected");
  fail_after = -1;
  CHECK(w.wait() == adp::crc32c(data.data(), data.size()), "the CRC");
  CHECK(copy == data, "the copy");
}

void prefault_skipped(const std::string& dir) {
  const std::string path = dir + "/thread-alloc.img";
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, 16 << 20) == 0 && ::pwrite(fd, "x", 1, 0) == 1, "create %s", path.c_str());
  if (fd >= 0) ::close(fd);
  std::unique_ptr<adp::CardDevice> dev;
  adp::Status s = adp::CardDevice::Open(path, 0, &dev);
  CHECK(s.ok() && dev->mapped(), "open %s mapped: %s", path.c_str(), s.message().c_str());
  if (s.ok() && dev->mapped()) {
    fail_after = 0;
    try {
      dev->start_prefault();
    } catch (const std::bad_alloc&) {
      CHECK(false, "CardDevice::start_prefault threw std::bad_alloc");
    }
    CHECK(fail_after == -1, "start_prefault allocated nothing: no failure injected");
    fail_after = -1;
    CHECK(adp::testing::threads_named("adp-prefault") == 0 && !dev->prefault_done(), "a prefault started");
    CHECK(dev->mapped()[0] == 'x', "the mapped byte");
  }
  dev.reset();
  ::unlink(path.c_str());
}

// The gateway's segment prefaulter (2e31a25): the segment is left to its loads, and a later registration of it
// starts the thread and populates it.
void segment_left_to_its_loads(const std::string& dir) {
  const std::string path = dir + "/thread-alloc-segment";
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, 1 << 20) == 0 && ::pwrite(fd, "x", 1, 0) == 1, "create %s", path.c_str());
  if (fd >= 0) ::close(fd);
  std::unique_ptr<ClientSegment> seg;
  adp::Status s = ClientSegment::Attach(::open(path.c_str(), O_RDWR | O_CLOEXEC), 1 << 20, &seg);
  CHECK(s.ok(), "attach %s: %s", path.c_str(), s.message().c_str());
  if (s.ok()) {
    SegmentPrefaulter pre;
    fail_after = 0;
    try {
      pre.add(*seg);
    } catch (const std::bad_alloc&) {
      CHECK(false, "SegmentPrefaulter::add threw std::bad_alloc");
    }
    CHECK(fail_after == -1, "SegmentPrefaulter::add allocated nothing: no failure injected");
    fail_after = -1;
    CHECK(pre.segments_done() == 0 && seg->data()[0] == 'x', "the segment after a failed start");
    pre.add(*seg);  // registered again: the thread starts now
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pre.segments_done() == 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(pre.segments_done() == 1, "a later registration did not populate the segment");
  }
  seg.reset();
  ::unlink(path.c_str());
}

// Recovery's scan of a card of 8 regions (all zeros: nothing found) with 4 threads asked for: its allocations on
// the calling thread are the scans (1), the pool (1), then each thread's state. `let` 2: the first thread's state
// throws (the old code failed the scan); 3: the second's, after one started (the old code ended the process:
// std::terminate, a joinable thread destroyed).
void recovery_without_a_thread(const std::string& dir, int let) {
  const std::string path = dir + "/thread-alloc-recovery.img";
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, 9 << 20) == 0, "create %s", path.c_str());
  if (fd >= 0) ::close(fd);
  std::unique_ptr<adp::CardDevice> dev;
  adp::Status s = adp::CardDevice::Open(path, 0, &dev);
  CHECK(s.ok(), "open %s: %s", path.c_str(), s.message().c_str());
  if (s.ok()) {
    const adp::CardGeometry g{1, 1 << 20, 1 << 20, 8};
    std::vector<adp::RegionScan> scans;
    fail_after = let;
    try {
      s = adp::scan_regions(*dev, g, 4, &scans);
      CHECK(s.ok() && scans.size() == 8, "scan (let %d): %s, %zu scans", let, s.message().c_str(), scans.size());
    } catch (const std::bad_alloc&) {
      CHECK(false, "scan_regions (let %d) threw std::bad_alloc", let);
    }
    CHECK(fail_after == -1, "scan_regions (let %d): no failure injected", let);
    fail_after = -1;
  }
  dev.reset();
  ::unlink(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::one_argument(argc, argv, "TMPFS_DIR", &dir)) return 2;
  crc_on_the_callers_thread();
  prefault_skipped(dir);
  segment_left_to_its_loads(dir);
  recovery_without_a_thread(dir, 2);
  recovery_without_a_thread(dir, 3);
  return adp::testing::finish("thread_alloc_test");
}
