// SPDX-License-Identifier: Apache-2.0
// Probe for issue 10 item 2, process stores of large objects (session eight):
// what each way of getting a client's object into a tmpfs card costs per byte
// with T threads at once, each storing its own objects (OBJ MiB each, 1 GiB of
// card in all per pass), the client's memory read with process_vm_readv (of
// this process: the same kernel path as another's, pages pinned per call):
//  E) embedded: crc32c_copy client -> card (one pass; what the connector does)
//  A) the store buffer as on main: the object read whole into a buffer of its
//     size in 1 MiB pieces, then crc32c_copy buffer -> card
//  P) per piece on one thread: a 1 MiB piece read into a warm buffer, then
//     crc32c_copy of that piece into the card while it is in the cache
//  R) per piece on two threads: a reader reads pieces into a ring of 4 warm
//     1 MiB slots, the storing thread crc32c_copies each into the card (the
//     reader holds nothing of the card; the store's thread can bound its wait)
//  V) the read alone: pieces read into the warm 1 MiB buffer (no card write)
//  D) the read straight into the card, piece by piece, each piece's CRC while
//     it is in the cache (session six's fill path, before the stall fix)
// Session sixteen (ringstore), the ring's store and the parts of each pass:
//  M) memcpy client -> an object-sized warm buffer (the connector's copy into
//     the ring, alone)
//  G) the ring store as on main: memcpy client -> ring area (the connector),
//     then crc32c_copy ring -> card (the gateway), one after the other
//  Q) a pipelined ring store: a second thread memcpys 1 MiB pieces into the
//     ring area while this one crc32c_copies each piece into the card as it
//     lands (what a ring store published in pieces would reach)
//  W) memcpy client -> card, no CRC (the card write alone)
//  C) crc32c over the client's object alone (no copy)
// Build (from the repository root):
//   g++ -O2 -std=c++20 -march=native -pthread -Isrc_cpp -o /tmp/spp benchmarks/probes/store_pipeline.cc
//   src_cpp/util/crc32c.cc
// Run: /tmp/spp THREADS OBJ_MiB   (writes /dev/shm/store-pipeline.img, removed after);
// PROBE_MODES=0,6,7 runs those modes only, in that order. Ratios to E:
// python benchmarks/probes/store_pipeline_ratios.py OUTPUT
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
constexpr int kSlots = 4;
// process_vm_readv of this process's src into dst.
void pvr(uint8_t* dst, const uint8_t* src, size_t len) { probe::own_process_copy(false, dst, src, len); }

}  // namespace

int main(int argc, char** argv) {
  const auto [threads, obj, total, per] = probe::shape(argc, argv);
  uint8_t* card = probe::map_card("/dev/shm/store-pipeline.img", total, 0);  // the tmpfs pages allocated
  uint8_t* src = map_anon(total);                                            // the clients' objects, out of the cache
  std::vector<uint8_t*> whole(threads), warm(threads), ring(threads);
  for (int t = 0; t < threads; t++) {
    whole[t] = map_anon(obj);
    warm[t] = map_anon(kPiece);
    ring[t] = map_anon(kSlots * kPiece);
  }
  std::atomic<uint32_t> sink{0};
  auto store = [&](int mode, int t) {
    sink ^= probe::over_objects(t, per, obj, src, card, [&](const uint8_t* s, uint8_t* d) -> uint32_t {
      if (mode == 0) {
        return crc32c_copy(d, s, obj);
      } else if (mode == 1) {
        for (size_t p = 0; p < obj; p += kPiece) pvr(whole[t] + p, s + p, kPiece);
        return crc32c_copy(d, whole[t], obj);
      } else if (mode == 2) {
        uint32_t k = 0;
        for (size_t p = 0; p < obj; p += kPiece) {
          pvr(warm[t], s + p, kPiece);
          k = crc32c_copy_extend(k, d + p, warm[t], kPiece);
        }
        return k;
      } else if (mode == 4) {
        for (size_t p = 0; p < obj; p += kPiece) pvr(warm[t], s + p, kPiece);
        return warm[t][0];
      } else if (mode == 5) {
        uint32_t k = 0;
        for (size_t p = 0; p < obj; p += kPiece) {
          pvr(d + p, s + p, kPiece);
          k = crc32c_extend(k, d + p, kPiece);
        }
        return k;
      } else if (mode == 6) {
        std::memcpy(whole[t], s, obj);
        return whole[t][obj - 1];
      } else if (mode == 7) {
        std::memcpy(whole[t], s, obj);
        return crc32c_copy(d, whole[t], obj);
      } else if (mode == 8) {
        const size_t n = obj / kPiece;
        std::atomic<size_t> landed{0};
        std::thread client([&] {
          for (size_t p = 0; p < n; p++) {
            std::memcpy(whole[t] + p * kPiece, s + p * kPiece, kPiece);
            landed.store(p + 1, std::memory_order_release);
          }
        });
        uint32_t k = 0;
        for (size_t p = 0; p < n; p++) {
          while (landed.load(std::memory_order_acquire) <= p) std::this_thread::yield();
          k = crc32c_copy_extend(k, d + p * kPiece, whole[t] + p * kPiece, kPiece);
        }
        client.join();
        return k;
      } else if (mode == 9) {
        std::memcpy(d, s, obj);
        return d[obj - 1];
      } else if (mode == 10) {
        return crc32c(s, obj);
      } else if (mode == 3) {
        const size_t n = obj / kPiece;
        std::atomic<size_t> read{0}, copied{0};
        std::thread reader([&] {
          for (size_t p = 0; p < n; p++) {
            while (p - copied.load(std::memory_order_acquire) >= kSlots) std::this_thread::yield();
            pvr(ring[t] + (p % kSlots) * kPiece, s + p * kPiece, kPiece);
            read.store(p + 1, std::memory_order_release);
          }
        });
        uint32_t k = 0;
        for (size_t p = 0; p < n; p++) {
          while (read.load(std::memory_order_acquire) <= p) std::this_thread::yield();
          k = crc32c_copy_extend(k, d + p * kPiece, ring[t] + (p % kSlots) * kPiece, kPiece);
          copied.store(p + 1, std::memory_order_release);
        }
        reader.join();
        return k;
      }
      return 0;
    });
  };
  const std::vector<const char*> names = {"E embedded crc_copy",
                                          "A whole buffer, then crc_copy",
                                          "P piece read, crc_copy hot",
                                          "R reader thread + crc_copy",
                                          "V read alone, into warm",
                                          "D read into the card, CRC hot",
                                          "M memcpy into the ring alone",
                                          "G ring: memcpy, then crc_copy",
                                          "Q ring in pieces, 2 threads",
                                          "W memcpy into the card alone",
                                          "C crc32c alone"};
  probe::run_passes(threads, obj, per, names, store);
  unlink("/dev/shm/store-pipeline.img");
  return sink.load() == 12345 ? 2 : 0;
}
