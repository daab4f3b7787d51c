// SPDX-License-Identifier: Apache-2.0
// A tmpfs card's prefault (CardDevice::start_prefault) never asks the kernel
// for a scan of more than one piece of the image under its inode lock. tmpfs
// answers lseek SEEK_HOLE by walking the page cache page by page from the
// offset to the extent's end with the inode lock held, and a pwritev of the
// image (a store's header, recovery's or a clean close's pad) takes that lock
// too: the prefault's SEEK_HOLE from 1 MiB of a full 8 GiB card held it
// 54 ms, and the first store after the open waited 42 ms of it
// (benchmarks/results/2026-12-05-0350-prefault24.md). This program stands in
// for the C library's lseek (its calls from the store's code, linked in here,
// come to it) and records each SEEK_HOLE and SEEK_DATA with where it began
// and what it answered: a SEEK_HOLE's scan is that span, all of it data.
// It checks, over an image holding a 256 MiB extent (a card's filled
// regions) and extents that do not line up with the pieces, that no
// SEEK_HOLE spans more than kPrefaultPieceBytes, and that the prefault
// still maps exactly the written pages.
//
// Not built under a sanitizer (its runtime has lseek of its own).
//
//   card_prefault_seek_test <tmpfs dir>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "page_state.h"
#include "store/card_device.h"
#include "util/prefault.h"

namespace {

struct Seek {
  int whence;
  int64_t from, to;  // to: the answer (-1 on an error)
};
std::mutex seeks_mu;
std::vector<Seek> seeks;

off_t recorded_lseek(int fd, off_t offset, int whence) {
  const off_t r = static_cast<off_t>(::syscall(SYS_lseek, fd, offset, whence));
  if (whence == SEEK_DATA || whence == SEEK_HOLE) {
    std::lock_guard<std::mutex> lock(seeks_mu);
    seeks.push_back({whence, static_cast<int64_t>(offset), static_cast<int64_t>(r)});
  }
  return r;
}

}  // namespace

// The C library's lseek, as the store's code linked into this program calls it.
extern "C" off_t lseek(int fd, off_t offset, int whence) { return recorded_lseek(fd, offset, whence); }
extern "C" off64_t lseek64(int fd, off64_t offset, int whence) { return recorded_lseek(fd, offset, whence); }

namespace {

constexpr uint64_t kPage = 4096, kMiB = 1 << 20;

void scans_at_most_a_piece(const std::string& dir) {
  const std::string path = dir + "/prefault-seek.img";
  const uint64_t size = 320 * kMiB;
  const std::vector<std::pair<uint64_t, uint64_t>> extents = {
      {0, kPage}, {kMiB, 256 * kMiB}, {270 * kMiB + 3 * kPage, 40 * kPage}, {300 * kMiB - kPage, 18 * kMiB}};
  adp::testing::make_sparse_file(path, size, extents);
  std::unique_ptr<adp::CardDevice> dev;
  adp::Status s = adp::CardDevice::Open(path, 0, &dev);
  CHECK(s.ok() && dev->mapped(), "open %s mapped: %s", path.c_str(), s.message().c_str());
  if (!s.ok() || !dev->mapped()) return;
  {
    std::lock_guard<std::mutex> lock(seeks_mu);
    seeks.clear();
  }
  dev->start_prefault();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!dev->prefault_done() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(dev->prefault_done(), "the prefault did not finish");
  const adp::testing::PageDiff d = adp::testing::page_diff(adp::testing::present_pages(dev->mapped(), size), extents);
  CHECK(d.missing == 0, "%zu pages of written extents not mapped", d.missing);
  CHECK(d.extra == 0, "%zu pages of holes mapped", d.extra);
  std::lock_guard<std::mutex> lock(seeks_mu);
  CHECK(!seeks.empty(), "the prefault made no SEEK_DATA or SEEK_HOLE (is lseek still recorded?)");
  int64_t longest = 0;
  for (const Seek& k : seeks)
    if (k.whence == SEEK_HOLE && k.to > k.from) longest = std::max(longest, k.to - k.from);
  CHECK(longest <= static_cast<int64_t>(adp::kPrefaultPieceBytes),
        "a SEEK_HOLE scanned %lld MiB of data under the image's inode lock (at most a piece, %llu MiB)",
        static_cast<long long>(longest / kMiB), static_cast<unsigned long long>(adp::kPrefaultPieceBytes / kMiB));
  dev.reset();
  ::unlink(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s TMPFS_DIR\n", argv[0]);
    return 2;
  }
  scans_at_most_a_piece(argv[1]);
  return adp::testing::finish("card_prefault_seek_test");
}
