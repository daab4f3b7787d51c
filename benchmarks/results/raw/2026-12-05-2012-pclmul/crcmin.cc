#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "util/crc32c.h"
int main() {
  std::vector<unsigned char> a(2 << 20, 1), b(2 << 20);
  for (size_t i = 0; i < a.size(); i++) a[i] = i * 31;
  unsigned x = 0;
  double m1 = 1e9, m2 = 1e9;
  for (int i = 0; i < 400; i++) {
    auto t0 = std::chrono::steady_clock::now();
    x += adp::crc32c(a.data(), a.size());
    auto t1 = std::chrono::steady_clock::now();
    x += adp::crc32c_copy(b.data(), a.data(), a.size());
    auto t2 = std::chrono::steady_clock::now();
    m1 = std::min(m1, std::chrono::duration<double>(t1 - t0).count());
    m2 = std::min(m2, std::chrono::duration<double>(t2 - t1).count());
  }
  printf("%s: min per 2 MiB: crc32c %.3f ms (%.1f GiB/s), crc32c_copy %.3f ms (%.1f GiB/s) [%u]\n",
         adp::crc32c_implementation(), m1 * 1e3, 2 / 1024.0 / m1, m2 * 1e3, 2 / 1024.0 / m2, x);
}
