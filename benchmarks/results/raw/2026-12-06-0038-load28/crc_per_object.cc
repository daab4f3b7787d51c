// CRC time per 2 MiB object as a load pays it (session 28, load28): the card's own crc32c / crc32c_copy
// (src_cpp/util/crc32c.cc), one thread. "straight": crc32c over the object in L1 after the read (L1 = 128
// objects of 2 MiB in MADV_HUGEPAGE memory, each written before, as a DMA would, so not in the CPU's cache
// when checked: the sweep is 256 MiB). "staged": crc32c_copy from one of 4 staging buffers (4 workers) into
// the object's L1 slot. 7 sweeps; per object: min and median over all calls.
// g++ -O2 -std=c++20 -march=native -Isrc_cpp -o /tmp/crc_per_object crc_per_object.cc src_cpp/util/crc32c.cc
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "util/crc32c.h"

int main() {
  const size_t obj = 2u << 20, n = 128, sweeps = 7;
  auto map = [](size_t b) {
    void* p = mmap(nullptr, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(p, b, MADV_HUGEPAGE);
    std::memset(p, 1, b);
    return static_cast<uint8_t*>(p);
  };
  uint8_t* l1 = map(obj * n);
  uint8_t* staging = map(obj * 4);
  std::vector<double> straight, staged;
  uint32_t sum = 0;
  for (size_t s = 0; s < sweeps; s++) {
    for (size_t i = 0; i < n; i++) {
      std::memset(l1 + i * obj, int(i + s), obj);  // the read's bytes, then flush them out by the sweep
    }
    for (size_t i = 0; i < n; i++) {
      auto t0 = std::chrono::steady_clock::now();
      sum += adp::crc32c(l1 + i * obj, obj);
      straight.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    for (size_t i = 0; i < n; i++) {
      std::memset(staging + (i % 4) * obj, int(i), obj);
      auto t0 = std::chrono::steady_clock::now();
      sum += adp::crc32c_copy(l1 + i * obj, staging + (i % 4) * obj, obj);
      staged.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  auto show = [](const char* name, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    std::printf("%s: per 2 MiB object min %.3f ms, median %.3f ms, p90 %.3f ms (%zu calls)\n", name, v[0],
                v[v.size() / 2], v[v.size() * 9 / 10], v.size());
  };
  show("straight: crc32c over the object in L1", straight);
  show("staged: crc32c_copy staging -> L1", staged);
  std::printf("[%u] implementation %s\n", sum, adp::crc32c_implementation());
}
