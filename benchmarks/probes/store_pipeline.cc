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
// Build (from the repository root):
//   g++ -O2 -std=c++20 -march=native -pthread -Isrc_cpp -o /tmp/spp benchmarks/probes/store_pipeline.cc
//   src_cpp/util/crc32c.cc
// Run: /tmp/spp THREADS OBJ_MiB   (writes /dev/shm/store-pipeline.img, removed after)
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

#include "util/crc32c.h"
using namespace adp;
using C = std::chrono::steady_clock;

namespace {
constexpr size_t kPiece = 1 << 20;
constexpr int kSlots = 4;
pid_t g_pid;

void pvr(uint8_t* dst, const uint8_t* src, size_t len) {
  iovec l{dst, len}, r{const_cast<uint8_t*>(src), len};
  if (process_vm_readv(g_pid, &l, 1, &r, 1, 0) != static_cast<ssize_t>(len)) {
    perror("process_vm_readv");
    exit(1);
  }
}

uint8_t* map_anon(size_t n) {
  auto* p = static_cast<uint8_t*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  memset(p, 1, n);
  return p;
}
}  // namespace

int main(int argc, char** argv) {
  const int threads = atoi(argv[1]);
  const size_t obj = size_t(atoi(argv[2])) << 20;
  const size_t total = size_t(1) << 30;
  const size_t per = total / threads / obj * obj;  // card bytes per thread
  g_pid = getpid();
  int fd = open("/dev/shm/store-pipeline.img", O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (ftruncate(fd, total) != 0) return 1;
  auto* card = static_cast<uint8_t*>(mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  memset(card, 0, total);          // the tmpfs pages allocated
  uint8_t* src = map_anon(total);  // the clients' objects, out of the cache
  std::vector<uint8_t*> whole(threads), warm(threads), ring(threads);
  for (int t = 0; t < threads; t++) {
    whole[t] = map_anon(obj);
    warm[t] = map_anon(kPiece);
    ring[t] = map_anon(kSlots * kPiece);
  }
  std::atomic<uint32_t> sink{0};
  auto store = [&](int mode, int t) {
    uint32_t c = 0;
    for (size_t at = t * per; at + obj <= (t + 1) * per; at += obj) {
      const uint8_t* s = src + at;
      uint8_t* d = card + at;
      if (mode == 0) {
        c ^= crc32c_copy(d, s, obj);
      } else if (mode == 1) {
        for (size_t p = 0; p < obj; p += kPiece) pvr(whole[t] + p, s + p, kPiece);
        c ^= crc32c_copy(d, whole[t], obj);
      } else if (mode == 2) {
        uint32_t k = 0;
        for (size_t p = 0; p < obj; p += kPiece) {
          pvr(warm[t], s + p, kPiece);
          k = crc32c_copy_extend(k, d + p, warm[t], kPiece);
        }
        c ^= k;
      } else if (mode == 4) {
        for (size_t p = 0; p < obj; p += kPiece) pvr(warm[t], s + p, kPiece);
        c ^= warm[t][0];
      } else if (mode == 5) {
        uint32_t k = 0;
        for (size_t p = 0; p < obj; p += kPiece) {
          pvr(d + p, s + p, kPiece);
          k = crc32c_extend(k, d + p, kPiece);
        }
        c ^= k;
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
        c ^= k;
      }
    }
    sink ^= c;
  };
  const char* names[] = {"E embedded crc_copy",        "A whole buffer, then crc_copy",
                         "P piece read, crc_copy hot", "R reader thread + crc_copy",
                         "V read alone, into warm",    "D read into the card, CRC hot"};
  for (int rep = 0; rep < 3; rep++)
    for (int mode = 0; mode < 6; mode++) {
      auto t0 = C::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; t++) ts.emplace_back(store, mode, t);
      for (auto& th : ts) th.join();
      double s = std::chrono::duration<double>(C::now() - t0).count();
      printf("threads %d obj %zu MiB %-30s %6.2f GB/s\n", threads, obj >> 20, names[mode],
             double(per) * threads / s / 1e9);
      fflush(stdout);
    }
  unlink("/dev/shm/store-pipeline.img");
  return sink.load() == 12345 ? 2 : 0;
}
