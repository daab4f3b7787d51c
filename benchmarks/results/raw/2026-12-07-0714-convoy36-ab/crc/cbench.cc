#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "util/crc32c.h"
int main() {
  const size_t n = 256 << 10;
  std::vector<unsigned char> src(n), dst(n);
  for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 131 + 7);
  unsigned sink = 0;
  std::vector<double> t;
  for (int r = 0; r < 9; r++) {
    auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; i++) sink ^= adp::crc32c_copy(dst.data(), src.data(), n);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / 2000);
  }
  std::sort(t.begin(), t.end());
  std::printf("%.2f GB/s (sink %u)\n", n / t[4] / 1e9, sink);
}
