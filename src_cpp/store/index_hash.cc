// SPDX-License-Identifier: Apache-2.0
#include "store/index_hash.h"

#include <atomic>
#include <cstring>
#include <random>

namespace adp {
namespace {

struct SipKey {
  uint64_t k0, k1;
};

SipKey draw_key() {
  std::random_device rd;
  auto word = [&rd] { return uint64_t(rd()) << 32 ^ rd(); };
  return {word(), word()};
}

inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

// SipHash-2-4 (Aumasson and Bernstein), 64-bit output.
uint64_t siphash24(const SipKey& k, std::string_view in) {
  uint64_t v0 = 0x736f6d6570736575ull ^ k.k0, v1 = 0x646f72616e646f6dull ^ k.k1;
  uint64_t v2 = 0x6c7967656e657261ull ^ k.k0, v3 = 0x7465646279746573ull ^ k.k1;
  auto round = [&] {
    v0 += v1, v1 = rotl(v1, 13), v1 ^= v0, v0 = rotl(v0, 32);
    v2 += v3, v3 = rotl(v3, 16), v3 ^= v2;
    v0 += v3, v3 = rotl(v3, 21), v3 ^= v0;
    v2 += v1, v1 = rotl(v1, 17), v1 ^= v2, v2 = rotl(v2, 32);
  };
  const char* p = in.data();
  size_t n = in.size();
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t m;
    std::memcpy(&m, p, 8);
    v3 ^= m;
    round(), round();
    v0 ^= m;
  }
  uint64_t last = uint64_t(in.size()) << 56;
  uint64_t tail = 0;
  std::memcpy(&tail, p, n);
  last |= tail;
  v3 ^= last;
  round(), round();
  v0 ^= last;
  v2 ^= 0xff;
  round(), round(), round(), round();
  return v0 ^ v1 ^ v2 ^ v3;
}

std::atomic<uint64_t> test_mask{~0ull};  // narrow_index_hash_for_tests

}  // namespace

uint64_t index_hash(std::string_view key) {
  static const SipKey secret = draw_key();
  return siphash24(secret, key) & test_mask.load(std::memory_order_relaxed);
}

void narrow_index_hash_for_tests(int bits) { test_mask = bits >= 64 ? ~0ull : (1ull << bits) - 1; }

}  // namespace adp
