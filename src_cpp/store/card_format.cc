// SPDX-License-Identifier: Apache-2.0
#include "store/card_format.h"

namespace adp {

// MurmurHash64A (Austin Appleby, public domain) over the key bytes. The
// hash is recomputed from the stored key at recovery, so the choice only has
// to be good, not frozen.
uint64_t hash_key(std::string_view key) {
  constexpr uint64_t m = 0xc6a4a7935bd1e995ULL;
  constexpr int r = 47;
  const uint64_t seed = 0x41445043415244ULL;  // "ADPCARD"
  uint64_t h = seed ^ (key.size() * m);
  const char* p = key.data();
  size_t n = key.size();
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t k;
    std::memcpy(&k, p, 8);
    k *= m;
    k ^= k >> r;
    k *= m;
    h ^= k;
    h *= m;
  }
  if (n) {
    uint64_t tail = 0;
    std::memcpy(&tail, p, n);
    h ^= tail;
    h *= m;
  }
  h ^= h >> r;
  h *= m;
  h ^= h >> r;
  return h;
}

}  // namespace adp
