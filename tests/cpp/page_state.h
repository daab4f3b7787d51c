// SPDX-License-Identifier: Apache-2.0
// What the prefault tests (card_prefault_test.cc, segment_prefault_test.cc)
// look at: a file's allocated bytes, which pages of a mapping are present in
// this process's page tables, and how many of its threads bear a name.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "check.h"

namespace adp::testing {

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

}  // namespace adp::testing
