// SPDX-License-Identifier: Apache-2.0
// Probe for the store side of review r5 item 2 (session seven): what the
// connection's store buffer costs a process store on a tmpfs card, one
// thread, 1 GiB of card per pass, per object of OBJ MiB:
//  A) the read into the buffer (a memcpy stands for process_vm_readv), then
//     crc32c_copy buffer -> card mapping          (what e5980f9 does)
//  B) the read into the buffer in 256 KiB pieces, each checksummed while in
//     the cache, then a plain memcpy buffer -> card (a CRC not fused)
//  C) the read straight into the card in 256 KiB pieces, each checksummed
//     there (the fill path before e5980f9: one copy)
// Build (from the repository root):
//   g++ -O2 -std=c++20 -march=native -Isrc_cpp -o /tmp/sbc benchmarks/probes/store_buffer_copy.cc
//   src_cpp/util/crc32c.cc
// Run: /tmp/sbc OBJ_MiB   (writes /dev/shm/stall-probe.img, removed after)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "util/crc32c.h"
using namespace adp;
using C = std::chrono::steady_clock;
int main(int argc, char** argv) {
  size_t obj = size_t(atoi(argv[1])) << 20;
  size_t total = size_t(1) << 30;  // card bytes written per pass
  int fd = open("/dev/shm/stall-probe.img", O_RDWR | O_CREAT | O_TRUNC, 0600);
  ftruncate(fd, total);
  uint8_t* card = (uint8_t*)mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  std::vector<uint8_t> src(obj, 7), buf(obj, 1);
  memset(card, 0, total);  // allocate the tmpfs pages
  volatile uint32_t sink = 0;
  for (int rep = 0; rep < 3; rep++) {
    for (int mode = 0; mode < 3; mode++) {
      auto t = C::now();
      for (size_t at = 0; at + obj <= total; at += obj) {
        if (mode == 0) {
          memcpy(buf.data(), src.data(), obj);  // the read into the store buffer
          sink = crc32c_copy(card + at, buf.data(), obj);
        } else if (mode == 1) {
          uint32_t c = 0;
          for (size_t p = 0; p < obj; p += 256 << 10) {
            memcpy(buf.data() + p, src.data() + p, 256 << 10);
            c = crc32c_extend(c, buf.data() + p, 256 << 10);
          }
          memcpy(card + at, buf.data(), obj);
          sink = c;
        } else {
          uint32_t c = 0;
          for (size_t p = 0; p < obj; p += 256 << 10) {
            memcpy(card + at + p, src.data() + p, 256 << 10);
            c = crc32c_extend(c, card + at + p, 256 << 10);
          }
          sink = c;
        }
      }
      double s = std::chrono::duration<double>(C::now() - t).count();
      printf("obj %zu MiB mode %s: %.2f GB/s\n", obj >> 20,
             mode == 0   ? "A buf+crc_copy"
             : mode == 1 ? "B buf+crc, memcpy"
                         : "C direct+crc",
             total / s / 1e9);
    }
  }
  unlink("/dev/shm/stall-probe.img");
}
