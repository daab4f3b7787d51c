// SPDX-License-Identifier: Apache-2.0
// A file registered again (ClientSegment::Attach) while another connection lets go of the file's mapping at the
// same moment (review33d): Attach looks the mapping up under g_mu (weak_ptr::lock); where the mapping cannot be
// shared (the file's size changed, or the client shrank it and the mapping broke) that temporary reference is
// dropped at the end of its block, still under g_mu, and where the other connection let go in between it was the
// last one: ~SegmentMapping takes g_mu again on the same thread, and the gateway's registrations, releases and
// stats queries wait on g_mu for good.
//
// The window between the look-up and the drop holds no call, so this program widens it deterministically: it
// builds client_segment.cc into itself with weak_ptr<SegmentMapping>::lock() replaced by one that calls a hook
// after it took its reference. The hook lets the first connection's segment go (not the last reference yet: the
// look-up holds one) before Attach goes on. A registration that does not return within 20 s is the self-deadlock.
//
//   segment_reattach_test <tmpfs dir>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace adp::proto {
struct SegmentMapping;
}

namespace {
// Called in Attach's look-up, after the reference was taken (null: none).
std::function<void()> g_after_lock;
}  // namespace

// Explicit specialization, declared before client_segment.cc's first use of it.
template <>
std::shared_ptr<adp::proto::SegmentMapping> std::weak_ptr<adp::proto::SegmentMapping>::lock() const noexcept;

#include "protocol/client_segment.cc"  // NOLINT: its g_mu and SegmentMapping, with the lock() below

template <>
std::shared_ptr<adp::proto::SegmentMapping> std::weak_ptr<adp::proto::SegmentMapping>::lock() const noexcept {
  std::shared_ptr<adp::proto::SegmentMapping> p;
  try {
    if (!expired()) p = std::shared_ptr<adp::proto::SegmentMapping>(*this);
  } catch (const std::bad_weak_ptr&) {
  }
  if (p && g_after_lock) g_after_lock();
  return p;
}

#include "check.h"

namespace {

using adp::proto::ClientSegment;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;

int open_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  CHECK(fd >= 0, "open %s", path.c_str());
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::one_argument(argc, argv, "TMPFS_DIR", &dir)) return 2;
  const std::string path = dir + "/adp-segment-reattach-" + std::to_string(::getpid());
  ::unlink(path.c_str());
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, 1 * kMiB) == 0, "create %s", path.c_str());
  ::close(fd);

  // Connection 1 registers the file (1 MiB); the client then grows it (LMCache's pool made again at another size,
  // same inode), and connection 2 registers it at its new size: the mapping cannot be shared.
  std::unique_ptr<ClientSegment> first;
  adp::Status s = ClientSegment::Attach(open_file(path), 1 * kMiB, &first);
  CHECK(s.ok(), "first registration: %s", s.message().c_str());
  CHECK(::truncate(path.c_str(), 2 * kMiB) == 0, "grow %s", path.c_str());

  // In the look-up: connection 1 lets go of its segment (its reference dropped; the look-up's is now the last).
  std::atomic<bool> let_go{false};
  g_after_lock = [&] {
    g_after_lock = nullptr;
    std::thread([&] {
      first.reset();
      let_go.store(true);
    }).join();
  };
  std::atomic<bool> returned{false};
  std::unique_ptr<ClientSegment> second;
  adp::Status second_status = adp::Status::Ok();
  std::thread attach([&] {
    second_status = ClientSegment::Attach(open_file(path), 2 * kMiB, &second);
    returned.store(true);
  });
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!returned.load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!returned.load()) {
    std::printf(
        "segment_reattach_test: FAIL: the registration of the resized file did not return in 20 s (connection 1 let "
        "go: %d): Attach dropped the mapping's last reference under g_mu and ~SegmentMapping waits on g_mu, held by "
        "its own thread (self-deadlock)\n",
        let_go.load() ? 1 : 0);
    std::fflush(stdout);
    ::unlink(path.c_str());
    ::_exit(1);
  }
  attach.join();
  CHECK(let_go.load(), "the hook ran (connection 1 let go inside the look-up)");
  CHECK(second_status.ok(), "second registration: %s", second_status.message().c_str());
  CHECK(second && second->size() == 2 * kMiB, "the second registration maps the file's new size");
  CHECK(ClientSegment::mapped_bytes() == 2 * kMiB, "only the new mapping is counted (%llu bytes)",
        static_cast<unsigned long long>(ClientSegment::mapped_bytes()));
  second.reset();
  CHECK(ClientSegment::mapped_bytes() == 0, "no mapping left");
  ::unlink(path.c_str());
  return adp::testing::finish("segment_reattach_test");
}
