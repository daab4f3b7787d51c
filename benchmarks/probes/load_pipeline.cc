// SPDX-License-Identifier: Apache-2.0
// Probe for issue 10 item 2, loads (session sixteen, ringstore): what each way
// of getting an object from a tmpfs card into a client's anonymous L1 costs per
// byte with T threads at once, each loading its own objects (OBJ MiB each, 1 GiB
// of card in all per pass), the client's memory written with process_vm_writev
// (of this process: the same kernel path as another's, pages pinned per call):
//  E) embedded: crc32c_copy card -> L1 (one pass; what the connector does)
//  G) the ring, whole (r3): crc32c_copy card -> an object-sized ring area (the
//     gateway), then memcpy ring -> L1 (the client), one after the other
//  Q) the ring in pieces (r4): a second thread crc32c_copies 1 MiB pieces card
//     -> ring area, this one memcpys each piece ring -> L1 as it lands
//  B) process memory as on main: per 256 KiB piece, crc32c_copy card -> a warm
//     bounce buffer, then process_vm_writev bounce -> L1 (one thread)
//  P) process memory without the bounce: per 256 KiB piece, crc32c over the
//     card's piece, then process_vm_writev card -> L1 (the piece in the cache)
//  V) process_vm_writev alone, a warm 256 KiB buffer -> L1
// Build (from the repository root):
//   g++ -O2 -std=c++20 -march=native -pthread -Isrc_cpp -o /tmp/lpp benchmarks/probes/load_pipeline.cc
//   src_cpp/util/crc32c.cc
// Run: /tmp/lpp THREADS OBJ_MiB   (writes /dev/shm/load-pipeline.img, removed after); PROBE_MODES=0,1 picks modes.
// Ratios: python benchmarks/probes/store_pipeline_ratios.py OUTPUT (the same line format).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_passes.h"
#include "util/crc32c.h"
using namespace adp;
using probe::map_anon;

namespace {
constexpr size_t kPiece = 1 << 20;
constexpr size_t kBounce = 256 << 10;
// process_vm_writev of src into this process's dst.
void pvw(uint8_t* dst, const uint8_t* src, size_t len) {
  probe::own_process_copy(true, const_cast<uint8_t*>(src), dst, len);
}

}  // namespace

int main(int argc, char** argv) {
  const auto [threads, obj, total, per] = probe::shape(argc, argv);
  // The card's objects, written (out of the cache by the first pass).
  uint8_t* card = probe::map_card("/dev/shm/load-pipeline.img", total, 7);
  uint8_t* dst = map_anon(total);  // the clients' L1, touched
  std::vector<uint8_t*> ring(threads), bounce(threads);
  for (int t = 0; t < threads; t++) {
    ring[t] = map_anon(obj);
    bounce[t] = map_anon(kBounce);
  }
  std::atomic<uint32_t> sink{0};
  auto load = [&](int mode, int t) {
    sink ^= probe::over_objects(t, per, obj, card, dst, [&](const uint8_t* s, uint8_t* d) -> uint32_t {
      if (mode == 0) {
        return crc32c_copy(d, s, obj);
      } else if (mode == 1) {
        const uint32_t k = crc32c_copy(ring[t], s, obj);
        std::memcpy(d, ring[t], obj);
        return k;
      } else if (mode == 2) {
        const size_t n = obj / kPiece;
        std::atomic<size_t> landed{0};
        uint32_t k = 0;
        std::thread gateway([&] {
          for (size_t p = 0; p < n; p++) {
            k = crc32c_copy_extend(k, ring[t] + p * kPiece, s + p * kPiece, kPiece);
            landed.store(p + 1, std::memory_order_release);
          }
        });
        for (size_t p = 0; p < n; p++) {
          while (landed.load(std::memory_order_acquire) <= p) std::this_thread::yield();
          std::memcpy(d + p * kPiece, ring[t] + p * kPiece, kPiece);
        }
        gateway.join();
        return k;
      } else if (mode == 3) {
        uint32_t k = 0;
        for (size_t p = 0; p < obj; p += kBounce) {
          k = crc32c_copy_extend(k, bounce[t], s + p, kBounce);
          pvw(d + p, bounce[t], kBounce);
        }
        return k;
      } else if (mode == 4) {
        uint32_t k = 0;
        for (size_t p = 0; p < obj; p += kBounce) {
          k = crc32c_extend(k, s + p, kBounce);
          pvw(d + p, s + p, kBounce);
        }
        return k;
      } else if (mode == 5) {
        for (size_t p = 0; p < obj; p += kBounce) pvw(d + p, bounce[t], kBounce);
        return d[0];
      }
      return 0;
    });
  };
  const std::vector<const char*> names = {"E embedded crc_copy",         "G ring whole: crc_copy, memcpy",
                                          "Q ring in pieces, 2 threads", "B process: bounce, writev",
                                          "P process: crc, writev card", "V writev alone, from warm"};
  probe::run_passes(threads, obj, per, names, load);
  unlink("/dev/shm/load-pipeline.img");
  return sink.load() == 12345 ? 2 : 0;
}
