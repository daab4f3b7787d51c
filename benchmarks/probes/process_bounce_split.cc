// SPDX-License-Identifier: Apache-2.0
// Probe for issue 10 item 2 (process loads): the gateway's bounce path with
// one object's pieces split over S threads, against embedded's fused
// copy-and-CRC, at a piece size P. W "connections" each load objects of
// OBJ MiB from a tmpfs card mapping into another process's warm anonymous
// memory; each connection's S threads take its pieces in turn (piece i on
// thread i % S), each piece: crc32c_copy_extend card -> the thread's own
// bounce buffer, then process_vm_writev bounce -> client; the S threads meet
// at a barrier after each object (the reply waits for all its pieces).
// Embedded: W threads, crc32c_copy card -> the parent's own memory.
// MODE (session eight, what the bounce itself costs): bounce (the above,
// the default); direct: each piece's CRC read from the card mapping (the
// piece then in L2), then process_vm_writev straight from the mapping (no
// bounce write: what a pin held across the write would allow); pvm:
// process_vm_writev from the mapping alone, no CRC (the kernel's floor).
// Build (from the repository root):
//   g++ -O2 -std=c++20 -pthread -Isrc_cpp -o /tmp/pbs benchmarks/probes/process_bounce_split.cc src_cpp/util/crc32c.cc
// Run: /tmp/pbs OBJ_MiB PIECE_KiB W S TOTAL_GiB [bounce|direct|pvm|after]
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "util/crc32c.h"

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static size_t total, obj, piece;
static int W, S;
static bool embedded;
static int mode;  // 0 bounce, 1 direct, 2 pvm, 3 after
static char *src, *dst;
static pid_t target;
static std::vector<pthread_barrier_t> barriers;
static volatile uint32_t sink_crc;

static void* work(void* a) {
  const long id = (long)a, conn = id / S, part = id % S;
  const size_t n = total / obj;
  char* bounce = static_cast<char*>(aligned_alloc(4096, piece));
  memset(bounce, 0, piece);
  uint32_t crc = 0;
  for (size_t i = conn; i < n; i += W) {
    char *s = src + i * obj, *d = dst + i * obj;
    if (embedded) {
      crc ^= adp::crc32c_copy(d, s, obj);
      continue;
    }
    size_t k = 0;
    for (size_t o = 0; o < obj; o += piece, k++) {
      if (long(k % S) != part) continue;
      const char* from = bounce;
      if (mode == 0)
        crc = adp::crc32c_copy_extend(crc, bounce, s + o, piece);
      else if (mode == 1)
        crc = adp::crc32c_extend(crc, s + o, piece);
      if (mode != 0) from = s + o;
      iovec l{const_cast<char*>(from), piece}, r{d + o, piece};
      if (process_vm_writev(target, &l, 1, &r, 1, 0) != (ssize_t)piece) {
        perror("process_vm_writev");
        exit(1);
      }
      if (mode == 3) crc = adp::crc32c_extend(crc, s + o, piece);
    }
    if (S > 1) pthread_barrier_wait(&barriers[conn]);
  }
  sink_crc = crc;
  free(bounce);
  return nullptr;
}

static double run(bool emb) {
  embedded = emb;
  const int threads = emb ? W : W * S;
  const int saved = S;
  if (emb) S = 1;
  std::vector<pthread_t> th(threads);
  const double t0 = now();
  for (long i = 0; i < threads; i++) pthread_create(&th[i], nullptr, work, (void*)i);
  for (auto& t : th) pthread_join(t, nullptr);
  S = saved;
  return total / (now() - t0) / 1e9;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc != 6 && argc != 7) {
    fprintf(stderr, "usage: %s OBJ_MiB PIECE_KiB W S TOTAL_GiB [bounce|direct|pvm|after]\n", argv[0]);
    return 2;
  }
  obj = size_t(atol(argv[1])) << 20;
  piece = size_t(atol(argv[2])) << 10;
  W = atoi(argv[3]);
  S = atoi(argv[4]);
  total = size_t(atol(argv[5])) << 30;
  static const char* const kModes[] = {"bounce+pvm_writev", "crc+pvm_writev from the card", "pvm_writev alone",
                                       "pvm_writev from the card+crc after"};
  if (argc == 7)
    mode = !strcmp(argv[6], "direct") ? 1 : !strcmp(argv[6], "pvm") ? 2 : !strcmp(argv[6], "after") ? 3 : 0;
  barriers.resize(W);
  for (auto& b : barriers) pthread_barrier_init(&b, nullptr, S);
  dst = static_cast<char*>(mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  int fd = open("/dev/shm/pbs_card", O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (ftruncate(fd, total) != 0) return 1;
  src = static_cast<char*>(mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  memset(src, 2, total);
  int p1[2], p2[2];
  if (pipe(p1) || pipe(p2)) return 1;
  const pid_t parent = getpid();
  const pid_t c = fork();
  char b;
  if (c == 0) {
    target = parent;
    if (read(p1[0], &b, 1) != 1) _exit(1);  // the parent has touched dst: no COW faults
    run(false);                             // first touch of the card mapping
    for (int r = 0; r < 3; r++)
      printf("obj %zuMiB piece %zuKiB W=%d S=%d %s %.2f GB/s\n", obj >> 20, piece >> 10, W, S, kModes[mode],
             run(false));
    if (write(p2[1], "x", 1) != 1) _exit(1);
    _exit(0);
  }
  memset(dst, 1, total);
  if (write(p1[1], "x", 1) != 1) return 1;
  if (read(p2[0], &b, 1) != 1) return 1;
  waitpid(c, nullptr, 0);
  for (int r = 0; r < 3; r++) printf("obj %zuMiB W=%d embedded crc32c_copy %.2f GB/s\n", obj >> 20, W, run(true));
  unlink("/dev/shm/pbs_card");
  return 0;
}
