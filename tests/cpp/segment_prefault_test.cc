// SPDX-License-Identifier: Apache-2.0
// The background populate of client segments (proto::SegmentPrefaulter):
// after a segment is added, the gateway's mapping has exactly the file's
// written pages present, its holes are not (nothing allocated), and a load's
// prepare() over a written page makes no call; a file registered twice is
// gone over once; a segment released, or the prefaulter stopped, while it
// runs lets go part-way and cleanly (this test also runs under ASan and
// TSan); a file shrunk under it stops it with a WARNING; where the kernel
// refuses the call (refuse_populate_for_test) nothing is done.
//
//   segment_prefault_test <tmpfs dir>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "page_state.h"
#include "protocol/client_segment.h"
#include "util/populate.h"
#include "util/prefault.h"

namespace {

using adp::proto::ClientSegment;
using adp::proto::SegmentPrefaulter;
using adp::testing::allocated_bytes;
using adp::testing::present_pages;

constexpr uint64_t kPage = 4096, kMiB = 1 << 20;

// A /dev/shm file of `bytes` holding the given extents (written, as the
// client's own stores into its pool would), the rest holes.
std::string make_file(const std::string& path, uint64_t bytes,
                      const std::vector<std::pair<uint64_t, uint64_t>>& extents) {
  adp::testing::make_sparse_file(path, bytes, extents);
  return path;
}

std::unique_ptr<ClientSegment> attach(const std::string& path, uint64_t bytes) {
  std::unique_ptr<ClientSegment> seg;
  adp::Status s = ClientSegment::Attach(::open(path.c_str(), O_RDWR | O_CLOEXEC), bytes, &seg);
  CHECK(s.ok(), "attach %s: %s", path.c_str(), s.message().c_str());
  return seg;
}

int populate_threads() { return adp::testing::threads_named("adp-segpopulate"); }

// Whether this process still maps `path` (/proc/self/maps).
bool mapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(path) != std::string::npos) return true;
  return false;
}

template <typename F>
bool wait_for(F done) {
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

// Written extents (one of them ending inside a page, one longer than a
// piece) are populated, holes are not, nothing is allocated; loads into them
// then make no call, a load into a hole does. The same file registered again
// (another connection) is not gone over again.
void populates_the_written_pages(const std::string& dir) {
  const uint64_t size = 96 * kMiB;
  const std::vector<std::pair<uint64_t, uint64_t>> extents = {
      {0, kPage}, {4 * kMiB, 20 * kMiB}, {40 * kMiB, kMiB + 3 * kPage + 100}, {60 * kMiB, 30 * kMiB}};
  const std::string path = make_file(dir + "/seg-extents", size, extents);
  const uint64_t allocated = allocated_bytes(path);
  auto seg = attach(path, size);
  if (!seg) return;
  size_t present_before = 0;
  for (bool b : present_pages(seg->data(), size)) present_before += b;
  CHECK(present_before == 0, "%zu pages present before the populate", present_before);
  SegmentPrefaulter pre;
  pre.add(*seg);
  CHECK(wait_for([&] { return pre.segments_done() == 1; }), "the populate did not finish");
  uint64_t written = 0;
  for (auto [offset, n] : extents) written += ((offset + n + kPage - 1) / kPage - offset / kPage) * kPage;
  const adp::testing::PageDiff d = adp::testing::page_diff(present_pages(seg->data(), size), extents);
  CHECK(d.missing == 0, "%zu written pages not populated", d.missing);
  CHECK(d.extra == 0, "%zu pages of holes populated", d.extra);
  CHECK(allocated_bytes(path) == allocated, "the file's allocated bytes grew from %llu to %llu",
        static_cast<unsigned long long>(allocated), static_cast<unsigned long long>(allocated_bytes(path)));
  CHECK(pre.bytes() == written && pre.ns() > 0, "populated %llu bytes (want %llu) in %llu ns",
        static_cast<unsigned long long>(pre.bytes()), static_cast<unsigned long long>(written),
        static_cast<unsigned long long>(pre.ns()));
  // Loads into written pages make no call; one into a hole does, once.
  CHECK(!seg->prepare(4 * kMiB + 4096, 2 * kMiB) && !seg->prepare(61 * kMiB, 29 * kMiB) && !seg->prepare(0, 100),
        "a load into populated pages made a call");
  CHECK(seg->prepare(30 * kMiB, 2 * kMiB) && !seg->prepare(30 * kMiB, 2 * kMiB), "a load into a hole");
  // Registered again (another connection: the same mapping): not gone over again.
  auto again = attach(path, size);
  if (again) pre.add(*again);
  pre.stop();
  CHECK(pre.segments_done() == 1 && pre.bytes() == written, "the same file was gone over again");
  CHECK(adp::testing::threads_named_after_join("adp-segpopulate") == 0, "the populate thread outlived stop()");
  CHECK(seg->data()[4 * kMiB] == 0x5a, "the segment's bytes");
  seg.reset();
  again.reset();
  ::unlink(path.c_str());
}

// A load that comes first populated a piece: the background skips it.
void skips_what_a_load_populated(const std::string& dir) {
  const uint64_t size = 64 * kMiB;
  const std::string path = make_file(dir + "/seg-skip", size, {{0, size}});
  auto seg = attach(path, size);
  if (!seg) return;
  CHECK(seg->prepare(16 * kMiB, 16 * kMiB), "the load's own populate");
  SegmentPrefaulter pre;
  pre.add(*seg);
  CHECK(wait_for([&] { return pre.segments_done() == 1; }), "the populate did not finish");
  CHECK(pre.bytes() == size - 16 * kMiB, "populated %llu bytes, the load's piece again",
        static_cast<unsigned long long>(pre.bytes()));
  seg.reset();
  ::unlink(path.c_str());
}

// Released by its last connection while it runs: it lets go within a piece,
// and the mapping is unmapped (by the populate thread, the last holder)
// with no access after (ASan). Stopped while it runs: the same, and the
// thread ends.
void lets_go_when_released_or_stopped(const std::string& dir) {
  const uint64_t size = 256 * kMiB;
  const std::string path = make_file(dir + "/seg-release", size, {{0, size}});
  {
    SegmentPrefaulter pre;
    std::atomic<int> pieces{0};
    std::atomic<bool> released{false};
    pre.before_piece_for_test = [&](uint64_t) {
      // After the first piece: wait until the connection released the segment.
      if (pieces.fetch_add(1) == 1) wait_for([&] { return released.load(); });
    };
    auto seg = attach(path, size);
    if (!seg) return;
    pre.add(*seg);
    CHECK(wait_for([&] { return pieces.load() >= 2; }), "the populate did not begin");
    seg.reset();
    released = true;
    CHECK(wait_for([&] { return !mapped(path); }), "the segment stayed mapped after its release");
    CHECK(pieces.load() == 2 && pre.segments_done() == 0 && pre.bytes() < size,
          "it went on after the release (%d pieces, %llu bytes)", pieces.load(),
          static_cast<unsigned long long>(pre.bytes()));
    CHECK(populate_threads() == 1, "the thread waits for the next segment");
  }
  CHECK(adp::testing::threads_named_after_join("adp-segpopulate") == 0, "the populate thread outlived its prefaulter");
  {
    // Gated, not paced (review r15 N11): the second piece waits until stop() began, so exactly two pieces are
    // made however the threads are scheduled.
    SegmentPrefaulter pre;
    std::atomic<int> pieces{0};
    pre.before_piece_for_test = [&](uint64_t) {
      if (pieces.fetch_add(1) == 1) wait_for([&] { return pre.stop_requested(); });
    };
    auto seg = attach(path, size);
    if (!seg) return;
    pre.add(*seg);
    CHECK(wait_for([&] { return pieces.load() >= 2; }), "the populate did not reach its second piece");
    pre.stop();
    CHECK(pieces.load() == 2 && pre.segments_done() == 0 && pre.bytes() == 2 * adp::kPrefaultPieceBytes,
          "it went on after stop() (%d pieces, %llu bytes)", pieces.load(),
          static_cast<unsigned long long>(pre.bytes()));
    CHECK(adp::testing::threads_named_after_join("adp-segpopulate") == 0, "the populate thread outlived stop()");
    pre.add(*seg);  // stopped for good
    CHECK(adp::testing::threads_named_after_join("adp-segpopulate") == 0, "a stopped prefaulter started again");
    // A segment it let go part-way is queued again by another prefaulter (another gateway of this process).
    SegmentPrefaulter next;
    next.add(*seg);
    CHECK(wait_for([&] { return next.segments_done() == 1; }), "the segment let go was not gone over again");
  }
  // Destroyed while it runs (the gateway's shared state going): its first
  // piece waits until the destructor's stop() began.
  {
    auto seg = attach(path, size);
    auto pre = std::make_unique<SegmentPrefaulter>();
    std::atomic<int> pieces{0};
    SegmentPrefaulter* p = pre.get();
    pre->before_piece_for_test = [&pieces, p](uint64_t) {
      if (pieces.fetch_add(1) == 0) wait_for([p] { return p->stop_requested(); });
    };
    if (seg) pre->add(*seg);
    CHECK(wait_for([&] { return pieces.load() >= 1; }), "the populate did not begin");
    pre.reset();
    CHECK(pieces.load() == 1, "it went on after its destructor's stop() (%d pieces)", pieces.load());
    seg.reset();
    CHECK(!mapped(path) && adp::testing::threads_named_after_join("adp-segpopulate") == 0,
          "a prefaulter destroyed while it ran left a mapping or thread");
  }
  ::unlink(path.c_str());
}

// The client shrinks its file under the populate: the call fails (EFAULT,
// no SIGBUS), logged at WARNING (the pytest wrapper reads the line), and it
// stops.
void stops_on_a_shrunk_file(const std::string& dir) {
  const uint64_t size = 64 * kMiB;
  const std::string path = make_file(dir + "/seg-shrunk", size, {{0, size}});
  auto seg = attach(path, size);
  if (!seg) return;
  SegmentPrefaulter pre;
  std::atomic<int> pieces{0};
  pre.before_piece_for_test = [&](uint64_t offset) {
    if (offset == 16 * kMiB) CHECK(::truncate(path.c_str(), 8 * kMiB) == 0, "truncate");
    pieces++;
  };
  pre.add(*seg);
  CHECK(wait_for([&] { return pieces.load() >= 2; }), "the populate did not reach its second piece");
  pre.stop();  // the second piece's call was made: stop() waits for it
  CHECK(pieces.load() == 2 && pre.bytes() == 16 * kMiB && pre.segments_done() == 0,
        "populated %llu bytes in %d pieces of a file shrunk to 8 MiB at the second",
        static_cast<unsigned long long>(pre.bytes()), pieces.load());
  seg.reset();
  ::unlink(path.c_str());
}

// Where the kernel refuses MADV_POPULATE_WRITE: nothing is done.
void nothing_where_refused(const std::string& dir) {
  adp::refuse_populate_for_test();
  const uint64_t size = 16 * kMiB;
  const std::string path = make_file(dir + "/seg-refused", size, {{0, size}});
  auto seg = attach(path, size);
  if (!seg) return;
  SegmentPrefaulter pre;
  pre.add(*seg);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  pre.stop();
  CHECK(pre.bytes() == 0 && pre.segments_done() == 0, "populated %llu bytes where the kernel refuses",
        static_cast<unsigned long long>(pre.bytes()));
  size_t present = 0;
  for (bool b : present_pages(seg->data(), size)) present += b;
  CHECK(present == 0, "%zu pages present where the kernel refuses", present);
  seg.reset();
  ::unlink(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::one_argument(argc, argv, "TMPFS_DIR", &dir)) return 2;
  ::setenv("ADP_LOG_LEVEL", "WARNING", 1);  // before the first line: the shrunk file's WARNING is checked
  populates_the_written_pages(dir);
  skips_what_a_load_populated(dir);
  lets_go_when_released_or_stopped(dir);
  stops_on_a_shrunk_file(dir);
  nothing_where_refused(dir);  // last: the refusal stays for the process
  return adp::testing::finish("segment_prefault_test");
}
