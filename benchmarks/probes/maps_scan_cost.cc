// SPDX-License-Identifier: Apache-2.0
// Probe (brief mapsq32, session 32), loaded by maps_scan.py with ctypes: one
// full read of /proc/self/maps as RemoteBackend::find_segment made it before
// session 32 (std::ifstream, a std::string a line, sscanf, a std::map rebuilt;
// files already open kept by device and inode: here none are open, as on the
// anonymous path every re-check takes), and one PROCMAP_QUERY of a single
// address (what replaces it).
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <string_view>

namespace {
struct Range {
  uintptr_t hi;
  uint64_t off;
  bool shm;
};
struct ProcmapQuery {
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
int64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

extern "C" {
// Nanoseconds of one scan; *lines: the lines read.
int64_t adp_probe_scan(int* lines) {
  auto t0 = std::chrono::steady_clock::now();
  std::map<uintptr_t, Range> ranges;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) {
    n++;
    unsigned long long start, end, off, ino;
    unsigned maj, mnr;
    char perms[8];
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &off, &maj, &mnr, &ino,
                    &path_at) < 7)
      continue;
    std::string path = path_at > 0 ? line.substr(path_at) : "";
    bool shm = std::string_view(perms).substr(0, 2) == "rw" && perms[3] == 's' && path.rfind("/dev/shm/", 0) == 0;
    ranges[static_cast<uintptr_t>(start)] = {static_cast<uintptr_t>(end), off, shm};
  }
  *lines = n;
  return ns_since(t0);
}
// Nanoseconds of `reps` PROCMAP_QUERY ioctls for addr (without its name; with it into a stack buffer where
// name is set), on one fd opened once; -1 where the kernel has none.
int64_t adp_probe_query(uintptr_t addr, int reps, int name) {
  static int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  char buf[4096];
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; i++) {
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_addr = addr;
    if (name) {
      q.vma_name_addr = reinterpret_cast<uintptr_t>(buf);
      q.vma_name_size = sizeof buf;
    }
    if (::ioctl(fd, kProcmapQuery, &q) != 0) return -1;
  }
  return ns_since(t0);
}
}
