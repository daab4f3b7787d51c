// SPDX-License-Identifier: Apache-2.0
// What the prefault tests (card_prefault_test.cc, card_prefault_seek_test.cc,
// segment_prefault_test.cc) make and look at: a sparse file with written
// extents, a file's allocated bytes, which pages of a mapping are present in
// this process's page tables, and how many of its threads bear a name.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"

namespace adp::testing {

// A sparse file of `bytes` at path (made anew) holding the given extents (offset, length) written with a non-zero
// pattern, as another process, or a client's own stores into its pool, would have written them; the rest holes.
inline void make_sparse_file(const std::string& path, uint64_t bytes,
                             const std::vector<std::pair<uint64_t, uint64_t>>& extents) {
  ::unlink(path.c_str());
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0, "create %s", path.c_str());
  std::vector<uint8_t> chunk(4 << 20, 0x5a);
  for (auto [offset, n] : extents)
    for (uint64_t done = 0; done < n;) {
      size_t len = static_cast<size_t>(std::min<uint64_t>(chunk.size(), n - done));
      CHECK(::pwrite(fd, chunk.data(), len, static_cast<off_t>(offset + done)) == static_cast<ssize_t>(len), "pwrite");
      done += len;
    }
  ::close(fd);
}

inline uint64_t allocated_bytes(const std::string& path) {
  struct stat st{};
  ::stat(path.c_str(), &st);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Whether each 4 KiB page of [p, p + n) is present in this process's page tables.
inline std::vector<bool> present_pages(const uint8_t* p, uint64_t n) {
  constexpr uint64_t kPage = 4096;
  int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  std::vector<uint64_t> entries(n / kPage);
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / kPage * 8);
  ssize_t got = ::pread(fd, entries.data(), entries.size() * 8, at);
  ::close(fd);
  CHECK(got == static_cast<ssize_t>(entries.size() * 8), "read /proc/self/pagemap");
  std::vector<bool> out(entries.size());
  for (size_t i = 0; i < entries.size(); i++) out[i] = (entries[i] >> 63) & 1;
  return out;
}

// This process's threads named `name` (/proc/self/task/*/comm).
inline int threads_named(const std::string& name) {
  int n = 0;
  DIR* d = ::opendir("/proc/self/task");
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string got;
    std::getline(comm, got);
    n += got == name;
  }
  ::closedir(d);
  return n;
}

// threads_named(name) once it is 0, or after 2 s: a joined thread is still
// listed in /proc/self/task until the kernel releases it (its join returns
// when it clears its tid), a moment that a loaded machine stretches (seen in
// a fresh-clone CI run on the 2-core VM). A thread that really outlives its
// stop stays listed.
inline int threads_named_after_join(const std::string& name) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int n = threads_named(name);
  while (n != 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n = threads_named(name);
  }
  return n;
}

// Pages present that `extents` (offset, length) do not cover (extra), and pages
// they cover, whole or in part, that are not present (missing).
struct PageDiff {
  size_t missing = 0, extra = 0;
};
inline PageDiff page_diff(const std::vector<bool>& present, const std::vector<std::pair<uint64_t, uint64_t>>& extents) {
  constexpr uint64_t kPage = 4096;
  std::vector<bool> want(present.size(), false);
  for (auto [offset, n] : extents)
    for (uint64_t p = offset / kPage; p < (offset + n + kPage - 1) / kPage; p++) want[p] = true;
  PageDiff d;
  for (size_t i = 0; i < want.size(); i++) {
    d.missing += want[i] && !present[i];
    d.extra += !want[i] && present[i];
  }
  return d;
}

}  // namespace adp::testing
