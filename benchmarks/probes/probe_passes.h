// SPDX-License-Identifier: Apache-2.0
// What store_pipeline.cc and load_pipeline.cc share: warm anonymous memory,
// the modes picked by PROBE_MODES, and the timed passes (3 over every mode,
// the modes of a pass one after the other, T threads each moving its share).
#pragma once
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace probe {

// n bytes of private anonymous memory, every page written.
inline uint8_t* map_anon(size_t n) {
  auto* p = static_cast<uint8_t*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  memset(p, 1, n);
  return p;
}

// process_vm_readv (into local from this process's remote) or
// process_vm_writev (local to remote) of len bytes: the kernel's path for
// another process's memory, pages pinned per call.
inline void own_process_copy(bool write, uint8_t* local, const uint8_t* remote, size_t len) {
  static const pid_t pid = getpid();
  iovec l{local, len}, r{const_cast<uint8_t*>(remote), len};
  const ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
  if (n != static_cast<ssize_t>(len)) {
    perror(write ? "process_vm_writev" : "process_vm_readv");
    exit(1);
  }
}

// The command line (THREADS OBJ_MiB) and what follows from it: 1 GiB of
// card in all, each thread's share a whole number of objects.
struct Shape {
  int threads;
  size_t obj, total, per;
};
inline Shape shape(int argc, char** argv) {
  if (argc < 3 || atoi(argv[1]) < 1 || atoi(argv[2]) < 1) {
    fprintf(stderr, "usage: %s THREADS OBJ_MiB\n", argv[0]);
    exit(1);
  }
  Shape s{atoi(argv[1]), size_t(atoi(argv[2])) << 20, size_t(1) << 30, 0};
  s.per = s.total / s.threads / s.obj * s.obj;
  return s;
}

// A tmpfs card of n bytes at path (created, truncated), mapped shared, every byte set to fill.
inline uint8_t* map_card(const char* path, size_t n, int fill) {
  const int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, n) != 0) {
    perror(path);
    exit(1);
  }
  auto* p = static_cast<uint8_t*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  memset(p, fill, n);
  return p;
}

// PROBE_MODES (e.g. "0,6,7"): those modes, in that order; unset: 0 .. count - 1.
inline std::vector<int> modes(int count) {
  std::vector<int> out;
  for (const char* m = getenv("PROBE_MODES"); m && *m;) {
    const int mode = atoi(m);
    if (mode >= 0 && mode < count) out.push_back(mode);
    m = strchr(m, ',');
    if (m) m++;
  }
  if (out.empty())
    for (int mode = 0; mode < count; mode++) out.push_back(mode);
  return out;
}

// Thread t's objects, in order: one(from, to) for each object-sized step of
// its share of the two areas; the XOR of what one returns (kept, so that no
// pass is optimised away).
inline uint32_t over_objects(int t, size_t per, size_t obj, const uint8_t* from, uint8_t* to,
                             const std::function<uint32_t(const uint8_t*, uint8_t*)>& one) {
  uint32_t c = 0;
  for (size_t at = t * per; at + obj <= (t + 1) * per; at += obj) c ^= one(from + at, to + at);
  return c;
}

// 3 passes over the modes; a pass of a mode runs move(mode, t) on each of the
// threads at once and prints the GB/s of bytes_per_thread x threads.
inline void run_passes(int threads, size_t obj, size_t bytes_per_thread, const std::vector<const char*>& names,
                       const std::function<void(int, int)>& move) {
  using C = std::chrono::steady_clock;
  for (int rep = 0; rep < 3; rep++)
    for (int mode : modes(static_cast<int>(names.size()))) {
      const auto t0 = C::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; t++) ts.emplace_back(move, mode, t);
      for (auto& th : ts) th.join();
      const double s = std::chrono::duration<double>(C::now() - t0).count();
      printf("threads %d obj %zu MiB %-30s %6.2f GB/s\n", threads, obj >> 20, names[mode],
             double(bytes_per_thread) * threads / s / 1e9);
      fflush(stdout);
    }
}

}  // namespace probe
