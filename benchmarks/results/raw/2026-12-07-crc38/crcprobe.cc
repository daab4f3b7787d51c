// SPDX-License-Identifier: Apache-2.0
// crc38 probe: memcpy, a plain read pass (sum of 64-bit words), crc32c and crc32c_copy over 2 MiB and 32 MiB,
// warm buffers, fastest of many (crcmin.cc of session 27 extended). With -DBY_NAME each implementation this CPU
// runs is timed too, forced by name (crc32c_extend_by, tests-only entry), rounds interleaved A/B/B/A.
// Build: g++ -O2 -falign-loops=64 -std=c++17 -Isrc_cpp crcprobe.cc src_cpp/util/crc32c.cc -o crcprobe
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "util/crc32c.h"

using Clock = std::chrono::steady_clock;

// The read ceiling: 64-bit adds over the buffer, eight ymm accumulators (AVX2 where the CPU has it).
__attribute__((target("avx2"))) static uint64_t sum_words_avx2(const uint8_t* p, size_t n) {
  __m256i s[8];
  for (auto& v : s) v = _mm256_setzero_si256();
  for (size_t i = 0; i + 256 <= n; i += 256)
    for (int k = 0; k < 8; k++)
      s[k] = _mm256_add_epi64(s[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32 * k)));
  for (int k = 1; k < 8; k++) s[0] = _mm256_add_epi64(s[0], s[k]);
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s[0]);
  return out[0] + out[1] + out[2] + out[3];
}

static uint64_t sum_words(const uint8_t* p, size_t n) {
  if (__builtin_cpu_supports("avx2")) return sum_words_avx2(p, n);
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    uint64_t v[4];
    std::memcpy(v, p + i, 32);
    s0 += v[0];
    s1 += v[1];
    s2 += v[2];
    s3 += v[3];
  }
  return s0 + s1 + s2 + s3;
}

int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 200;
  for (size_t size : {size_t(2) << 20, size_t(32) << 20}) {
    std::vector<uint8_t> a(size), b(size);
    for (size_t i = 0; i < a.size(); i++) a[i] = static_cast<uint8_t>(i * 31 + (i >> 13));
    std::memset(b.data(), 0, b.size());
    int r = size > (8u << 20) ? rounds / 8 : rounds;
    struct Row {
      std::string name;
      double best = 1e9;
    };
    std::vector<Row> rows;
    volatile uint64_t sink = 0;
    auto time = [&](size_t row, auto&& f) {
      auto t0 = Clock::now();
      sink = sink + f();
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      rows[row].best = std::min(rows[row].best, s);
    };
    rows.push_back({"memcpy"});
    rows.push_back({"read pass (sum u64)"});
    rows.push_back({std::string("crc32c [") + adp::crc32c_implementation() + "]"});
    rows.push_back({std::string("crc32c_copy [") + adp::crc32c_implementation() + "]"});
#ifdef BY_NAME
    std::vector<std::string> impls;
    for (const char* name : adp::crc32c_implementations())
      if (std::string(name) != "bitwise") impls.push_back(name);  // ~100x slower: not timed
    size_t first_by = rows.size();
    for (auto& i : impls) {
      rows.push_back({"crc32c by " + i});
      rows.push_back({"crc32c_copy by " + i});
    }
#endif
    for (int k = 0; k < r; k++) {
      bool flip = k & 1;  // ABBA: every other round in the reverse order
      auto one = [&](size_t row) {
        switch (row) {
          case 0:
            time(0, [&] {
              std::memcpy(b.data(), a.data(), size);
              return uint64_t(b[size / 2]);
            });
            break;
          case 1:
            time(1, [&] { return sum_words(a.data(), size); });
            break;
          case 2:
            time(2, [&] { return uint64_t(adp::crc32c(a.data(), size)); });
            break;
          case 3:
            time(3, [&] { return uint64_t(adp::crc32c_copy(b.data(), a.data(), size)); });
            break;
          default:
#ifdef BY_NAME
          {
            size_t j = row - first_by;
            const char* name = impls[j / 2].c_str();
            if (j % 2 == 0)
              time(row, [&] { return uint64_t(*adp::crc32c_extend_by(name, 0, nullptr, a.data(), size)); });
            else
              time(row, [&] { return uint64_t(*adp::crc32c_extend_by(name, 0, b.data(), a.data(), size)); });
          }
#endif
          break;
        }
      };
      if (!flip)
        for (size_t i = 0; i < rows.size(); i++) one(i);
      else
        for (size_t i = rows.size(); i-- > 0;) one(i);
    }
    printf("%zu MiB, fastest of %d:\n", size >> 20, r);
    for (auto& row : rows)
      printf("  %-34s %8.3f ms  %6.1f GiB/s\n", row.name.c_str(), row.best * 1e3, double(size) / (1 << 30) / row.best);
  }
}
