// SPDX-License-Identifier: Apache-2.0
// CardStore::put alone, one thread, on a card image on tmpfs (the mapped
// path): objects from a warm buffer (the pointer path), and, where the tree
// has PutItem::fill (-DWITH_FILL), the same bytes from a fill that memcpys
// them (what a gateway's process_vm_readv does, without the kernel's part).
// Built against two source trees and run alternately, it compares the
// pointer path before and after a change with no connector, Python or
// scheduling in the way; the best of the repetitions is reported, which is
// what survives other work on a shared host.
//
// build: g++ -std=c++20 -O2 -Isrc_cpp -pthread benchmarks/probes/put_ab.cc src_cpp/store/*.cc src_cpp/util/*.cc
//        [-DWITH_FILL] -o put_ab
// run:   put_ab CARD_IMAGE OBJ_MiB TOTAL_MiB REPS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "store/card_store.h"
#include "util/aligned_buffer.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s CARD_IMAGE OBJ_MiB TOTAL_MiB REPS\n", argv[0]);
    return 2;
  }
  const size_t obj = size_t(std::atol(argv[2])) << 20, total = size_t(std::atol(argv[3])) << 20;
  const int reps = std::atoi(argv[4]);
  const size_t n = total / obj;
  adp::CardOptions co;
  co.path = argv[1];
  co.create_bytes = 2 * total + (256u << 20);  // the timed passes wrap within it
  std::unique_ptr<adp::CardStore> s;
  adp::Status st = adp::CardStore::Open(co, &s);
  if (!st.ok()) {
    std::fprintf(stderr, "open: %s\n", st.message().c_str());
    return 1;
  }
  adp::AlignedBuffer src;
  if (!src.reserve(total)) return 1;
  for (size_t i = 0; i < total; i++) src.data()[i] = uint8_t(i * 131 + 7);
  adp::IoContext ctx;
  auto pass = [&](bool fill, int rep) {
    std::vector<std::string> keys(n);
    std::vector<adp::PutItem> items(n);
    for (size_t i = 0; i < n; i++) {
      keys[i] = "k" + std::to_string(rep) + "/" + std::to_string(i);
      const uint8_t* p = src.data() + i * obj;
      items[i] = {keys[i], p, obj};
#ifdef WITH_FILL
      if (fill)
        items[i].fill = [p](uint8_t* dst, uint64_t off, size_t len) {
          std::memcpy(dst, p + off, len);
          return adp::Status::Ok();
        };
#else
      (void)fill;
#endif
    }
    std::vector<adp::Status> res(n);
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; i += 2)  // two objects a put, as a connector worker's slice
      s->put(ctx, items.data() + i, std::min<size_t>(2, n - i), res.data() + i, [] { return true; });
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (auto& r : res)
      if (!r.ok()) {
        std::fprintf(stderr, "put: %s\n", r.message().c_str());
        std::exit(1);
      }
    return double(n * obj) / sec / 1e9;
  };
  pass(false, -1);  // maps the card's pages once: first touch is not what is compared
  pass(false, -2);
  double best_ptr = 0, best_fill = 0;
  for (int r = 0; r < reps; r++) {
    best_ptr = std::max(best_ptr, pass(false, 2 * r));
#ifdef WITH_FILL
    best_fill = std::max(best_fill, pass(true, 2 * r + 1));
#endif
  }
  std::printf("object %zu MiB, %zu MiB a pass, best of %d: pointer %.2f GB/s", obj >> 20, total >> 20, reps, best_ptr);
  if (best_fill > 0) std::printf(", fill (memcpy) %.2f GB/s", best_fill);
  std::printf("\n");
  std::remove(argv[1]);
  return 0;
}
