// SPDX-License-Identifier: Apache-2.0
// Keys that share their 64-bit hash_key with a given key (MurmurHash64A with
// a public seed: a collision is solved for, as
// tests/gateway/test_process_memory.py's colliding_keys does), with or
// without its index hash too (store/index_hash.h: SipHash under a
// per-process secret; searched for, which takes a test that narrowed it with
// narrow_index_hash_for_tests). For the C++ test programs of tests/cpp that
// play a client forging keys.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "store/index_hash.h"

namespace adp::testing {

namespace forge_detail {
constexpr uint64_t kM = 0xc6a4a7935bd1e995ull;
inline uint64_t mix(uint64_t k) {
  k *= kM;
  k ^= k >> 47;
  return k * kM;
}
inline uint64_t unmix(uint64_t y) {
  uint64_t inv = kM;  // kM's inverse mod 2^64 (Newton: each step doubles the correct bits)
  for (int i = 0; i < 5; i++) inv *= 2 - kM * inv;
  uint64_t x = y * inv;
  x ^= x >> 47;
  return x * inv;
}
}  // namespace forge_detail

// A 16-byte key with victim's hash_key (victim: 16 bytes), its first 8 bytes
// from a counter; same_index: searched until its index_hash is victim's too,
// else until it differs.
inline std::string forge(const std::string& victim, bool same_index) {
  using forge_detail::kM, forge_detail::mix, forge_detail::unmix;
  const uint64_t h0 = 0x41445043415244ull ^ (16 * kM);
  uint64_t a1, a2;
  std::memcpy(&a1, victim.data(), 8);
  std::memcpy(&a2, victim.data() + 8, 8);
  const uint64_t h1a = (h0 ^ mix(a1)) * kM;
  for (uint64_t n = 1;; n++) {
    const uint64_t b1 = n * 0x9E3779B97F4A7C15ull, b2 = unmix(h1a ^ mix(a2) ^ ((h0 ^ mix(b1)) * kM));
    std::string key(16, '\0');
    std::memcpy(key.data(), &b1, 8);
    std::memcpy(key.data() + 8, &b2, 8);
    if (key != victim && (index_hash(key) == index_hash(victim)) == same_index) return key;
  }
}

}  // namespace adp::testing
