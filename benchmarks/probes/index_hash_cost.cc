// SPDX-License-Identifier: Apache-2.0
// The per-key hashing of the card index, before and after session 21: until
// then a store, load, exists or delete computed hash_key (MurmurHash64A, the
// index's key) and a 16-bit key tag (SipHash-2-4 under the process secret);
// now only index_hash (the same SipHash, all 64 bits, the index's key).
// Keys shaped like LMCache's (model@world@worker@chunk-hash, 16 to 128
// bytes); ns per key over 1 M keys, best of 5 passes.
//
//   g++ -std=c++20 -O2 -Isrc_cpp benchmarks/probes/index_hash_cost.cc \
//       src_cpp/store/card_format.cc src_cpp/store/index_hash.cc src_cpp/util/crc32c.cc -o /tmp/index_hash_cost
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "store/card_format.h"
#include "store/index_hash.h"

int main() {
  const size_t kKeys = 1 << 20;
  for (size_t len : {16, 64, 128}) {
    std::vector<std::string> keys;
    keys.reserve(kKeys);
    for (size_t i = 0; i < kKeys; i++) {
      std::string k = "llama@8@0@" + std::to_string(i * 0x9E3779B97F4A7C15ull);
      k.resize(len, 'x');
      keys.push_back(std::move(k));
    }
    auto best = [&](auto f) {
      double ns = 1e18;
      uint64_t sink = 0;
      for (int pass = 0; pass < 5; pass++) {
        auto t0 = std::chrono::steady_clock::now();
        for (const std::string& k : keys) sink += f(k);
        double t = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kKeys;
        ns = std::min(ns, t);
      }
      if (sink == 42) std::puts("");
      return ns;
    };
    const double before = best([](const std::string& k) { return adp::hash_key(k) ^ (adp::index_hash(k) & 0xffff); });
    const double after = best([](const std::string& k) { return adp::index_hash(k); });
    std::printf("| %zu | %.1f | %.1f |\n", len, before, after);
  }
  return 0;
}
