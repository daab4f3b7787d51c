// SPDX-License-Identifier: Apache-2.0
// Probe (issue 10 item 4, session 27): why the card's straight O_DIRECT read of
// a 2 MiB object into LMCache's L1 ran at 0.52x of fs_native's own straight
// read into the same L1 (benchmarks/results/2026-12-05-1635-disk.md).
//
// T threads (bench_l2's 4 workers) take the next of N objects of OBJ bytes and
// read it with O_DIRECT from files on the disk written just before (so the
// host's cache of the virtio image serves them, as in bench_l2), one way each:
//   fsfile   fs_native: open(file of the object, O_DIRECT), one read() of the
//            object into its slice of L1, close (strace of LMCacheFSClient)
//   img1     one preadv of one iovec: the payload only, from a card-layout
//            image (object k's header block at 4 KiB + k * (OBJ + 4 KiB))
//   img2iov  the card's straight path: one preadv of two iovecs, the header
//            block into a per-thread huge-page staging, the payload into L1
//   img2io   two preads: the header block into staging, then the payload
//   staged   the card's staged path: one preadv of header and payload into a
//            per-thread huge-page staging, then the payload copied into L1
//   imgfd    img1 through this thread's own descriptor of the image
//   fsopen   fsfile with every object's file opened before the rounds
//   al1      img1 from an image whose payloads are OBJ-aligned (the header
//            blocks elsewhere): the object's file offset as fs_native's
// with CRC=1 every way but fsfile checks the CRC as the card does (img*: a
// crc32c pass over L1 after the read; staged: crc32c_copy). Destinations:
//   L1 (4k)  an anonymous mapping, 4 KiB pages, every byte written once
//            (torch.empty + fill_ as `lmcache bench l2` makes its L1)
//   L1 (huge) the same advised MADV_HUGEPAGE (THP "madvise" here) before
//            it is touched: physically contiguous in 2 MiB pieces
//   L1 (sN)  N pieces of huge-page memory a piece apart (an iovec each): an
//            L1 object of N physical runs, fixed (a fresh process's 4 KiB
//            L1 had 65-290 runs per 2 MiB object in bench_l2, varying)
// Modes run one after the other within a round, every other round in reverse
// order; reported: median MiB/s per mode and the median over rounds of each
// mode / fsfile-4k of the same round (a paired ratio: the machine's load,
// shared with other engineers, moves both alike), and the disk's read
// requests per object (/proc/diskstats) and L1's physical runs per object
// (/proc/self/pagemap, root only; a request of more runs than the queue's
// max_segments, 254 here, is split).
//
// Build (from the repository root):
//   g++ -O2 -std=c++20 -march=native -pthread -Isrc_cpp -o /tmp/direct_read \
//     benchmarks/probes/direct_read.cc src_cpp/util/crc32c.cc
// Run: /tmp/direct_read DIR [OBJECTS=128] [OBJ_KiB=2048] [THREADS=4] [ROUNDS=9]
//   (PROBE_MODES=fsfile-4k,img2iov-4k,... picks modes, img1-huge/n: that mode without CRC; CRC=0 drops the CRC; KEEP=1
//   keeps the files)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "util/crc32c.h"

namespace {

constexpr size_t kBlock = 4096;
constexpr size_t kHuge = 2u << 20;

uint8_t* map_mem(size_t n, bool huge) {
  n = (n + kHuge - 1) / kHuge * kHuge;
  void* p = mmap(nullptr, n + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  auto* a = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kHuge - 1) / kHuge * kHuge);
  madvise(a, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  for (size_t i = 0; i < n; i++) a[i] = uint8_t(i * 7);  // written in order, as fill_ does
  return a;
}

// Physically contiguous runs of [p, p + n) (0 where pagemap hides frames).
size_t phys_runs(const uint8_t* p, size_t n) {
  int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) return 0;
  size_t runs = 0;
  uint64_t prev = 0;
  for (size_t off = 0; off < n; off += kBlock) {
    uint64_t e = 0;
    pread(fd, &e, 8, static_cast<off_t>((reinterpret_cast<uintptr_t>(p + off) / kBlock) * 8));
    uint64_t pfn = e & ((1ull << 55) - 1);
    if (!pfn) {
      close(fd);
      return 0;
    }
    if (off == 0 || pfn != prev + 1) runs++;
    prev = pfn;
  }
  close(fd);
  return runs;
}

uint64_t disk_reads(const std::string& dev) {
  std::ifstream f("/proc/diskstats");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream s(line);
    unsigned maj, mi;
    std::string name;
    uint64_t reads;
    s >> maj >> mi >> name >> reads;
    if (name == dev) return reads;
  }
  return 0;
}

void die(const char* what) {
  perror(what);
  exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR [OBJECTS] [OBJ_KiB] [THREADS] [ROUNDS]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const size_t n = argc > 2 ? atoi(argv[2]) : 128;
  const size_t obj = (argc > 3 ? atoi(argv[3]) : 2048) * size_t(1024);
  const int threads = argc > 4 ? atoi(argv[4]) : 4;
  const int rounds = argc > 5 ? atoi(argv[5]) : 9;
  const bool crc_env = !getenv("CRC") || atoi(getenv("CRC"));
  bool crc = crc_env;  // per mode: a mode named ...-4k/n or ...-huge/n checks no CRC
  const char* dev = getenv("DISK") ? getenv("DISK") : "vda";
  const size_t stride = obj + kBlock;

  // Files: a card-layout image, an image of OBJ-aligned payloads, one file per object.
  uint8_t* src = map_mem(obj + kBlock, true);
  std::vector<uint32_t> crcs(n);
  const std::string img = dir + "/card.img", al = dir + "/aligned.img";
  int fimg = open(img.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  int fal = open(al.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fimg < 0 || fal < 0) die("open image");
  for (size_t k = 0; k < n; k++) {
    memset(src, int(k), kBlock);  // the header block
    for (size_t i = 0; i < obj; i += 64) src[kBlock + i] = uint8_t(k + i / 64);
    crcs[k] = adp::crc32c(src + kBlock, obj);
    if (pwrite(fimg, src, stride, off_t(kBlock + k * stride)) != ssize_t(stride)) die("write image");
    if (pwrite(fal, src + kBlock, obj, off_t(k * obj)) != ssize_t(obj)) die("write aligned");
    std::string f = dir + "/obj" + std::to_string(k) + ".data";
    int fd = open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0 || write(fd, src + kBlock, obj) != ssize_t(obj)) die("write object file");
    close(fd);
  }

  struct Mem {
    uint8_t* l1;
    std::vector<uint8_t*> staging;
  };
  std::vector<int> own_fd(threads), obj_fd(n);
  for (int t = 0; t < threads; t++)
    if ((own_fd[t] = open(img.c_str(), O_RDONLY | O_DIRECT)) < 0) die("open image");
  for (size_t k = 0; k < n; k++)
    if ((obj_fd[k] = open((dir + "/obj" + std::to_string(k) + ".data").c_str(), O_RDONLY | O_DIRECT)) < 0)
      die("open object file");
  std::map<std::string, Mem> mems;
  for (bool huge : {false, true}) {
    Mem m{map_mem(n * obj, huge), {}};
    for (int t = 0; t < threads; t++) m.staging.push_back(map_mem(stride, true));
    mems[huge ? "huge" : "4k"] = m;
  }
  for (auto& [name, m] : mems) {
    size_t runs = phys_runs(m.l1, n * obj);
    printf("L1 (%s): %.1f physical runs per object (pagemap; 0 = hidden)\n", name.c_str(), double(runs) / n);
  }
  // sN: each object's destination N pieces of OBJ/N bytes of huge-page memory with a gap of a piece after
  // each (physically N runs: an L1 of 4 KiB pages whose object has N runs, as a fresh process's is).
  std::map<std::string, std::vector<std::vector<iovec>>> pieces;
  auto dst_of = [&](const std::string& mem, size_t k) -> std::vector<iovec> {
    if (mem[0] != 's') return {{mems.at(mem).l1 + k * obj, obj}};
    auto& all = pieces[mem];
    if (all.empty()) {
      const size_t np = std::stoul(mem.substr(1)), len = obj / np;
      if (len % kBlock || np * len != obj) {
        fprintf(stderr, "%s: OBJ / N must be a multiple of 4 KiB\n", mem.c_str());
        exit(2);
      }
      uint8_t* base = map_mem(2 * n * obj, true);
      for (size_t j = 0; j < n; j++) {
        all.emplace_back();
        for (size_t i = 0; i < np; i++) all.back().push_back({base + (j * np + i) * 2 * len, len});
      }
      size_t runs = 0;
      for (auto& d : all)
        for (auto& v : d) runs += phys_runs(static_cast<uint8_t*>(v.iov_base), v.iov_len);
      printf("L1 (%s): %.1f physical runs per object (pagemap)\n", mem.c_str(), double(runs) / n);
    }
    return all[k];
  };

  // An object's destination: one iovec (4k, huge) or its pieces (sN).
  using Dst = std::vector<iovec>;
  using ReadFn = std::function<bool(int t, size_t k, const Dst& dst, uint8_t* stg)>;
  auto check = [&](size_t k, const Dst& d) {
    if (!crc) return true;
    uint32_t c = 0;
    for (const iovec& v : d) c = adp::crc32c_extend(c, v.iov_base, v.iov_len);
    return c == crcs[k];
  };
  auto with_header = [](uint8_t* stg, const Dst& d) {
    Dst v{{stg, kBlock}};
    v.insert(v.end(), d.begin(), d.end());
    return v;
  };
  auto rd = [](int fd, const Dst& d, off_t at) { return preadv(fd, d.data(), int(d.size()), at); };
  std::map<std::string, ReadFn> ways = {
      {"fsfile",
       [&](int, size_t k, const Dst& d, uint8_t*) {
         std::string f = dir + "/obj" + std::to_string(k) + ".data";
         int fd = open(f.c_str(), O_RDONLY | O_DIRECT);
         bool ok = fd >= 0 && readv(fd, d.data(), int(d.size())) == ssize_t(obj);
         if (fd >= 0) close(fd);
         return ok;
       }},
      {"img1", [&](int, size_t k, const Dst& d,
                   uint8_t*) { return rd(fimg, d, off_t(2 * kBlock + k * stride)) == ssize_t(obj) && check(k, d); }},
      {"imgfd",
       [&](int t, size_t k, const Dst& d, uint8_t*) {
         return rd(own_fd[t], d, off_t(2 * kBlock + k * stride)) == ssize_t(obj) && check(k, d);
       }},
      {"fsopen",
       [&](int, size_t k, const Dst& d, uint8_t*) { return rd(obj_fd[k], d, 0) == ssize_t(obj) && check(k, d); }},
      {"img2iov",
       [&](int, size_t k, const Dst& d, uint8_t* stg) {
         return rd(fimg, with_header(stg, d), off_t(kBlock + k * stride)) == ssize_t(stride) && stg[0] == uint8_t(k) &&
                check(k, d);
       }},
      {"img2io",
       [&](int, size_t k, const Dst& d, uint8_t* stg) {
         return pread(fimg, stg, kBlock, off_t(kBlock + k * stride)) == ssize_t(kBlock) && stg[0] == uint8_t(k) &&
                rd(fimg, d, off_t(2 * kBlock + k * stride)) == ssize_t(obj) && check(k, d);
       }},
      {"staged",
       [&](int, size_t k, const Dst& d, uint8_t* stg) {
         iovec v{stg, stride};
         if (preadv(fimg, &v, 1, off_t(kBlock + k * stride)) != ssize_t(stride) || stg[0] != uint8_t(k)) return false;
         uint32_t c = 0;
         size_t at = kBlock;
         for (const iovec& x : d) {
           if (crc)
             c = adp::crc32c_copy_extend(c, x.iov_base, stg + at, x.iov_len);
           else
             memcpy(x.iov_base, stg + at, x.iov_len);
           at += x.iov_len;
         }
         return !crc || c == crcs[k];
       }},
      {"al1", [&](int, size_t k, const Dst& d,
                  uint8_t*) { return rd(fal, d, off_t(k * obj)) == ssize_t(obj) && check(k, d); }},
  };
  std::vector<std::string> modes;
  if (const char* pm = getenv("PROBE_MODES")) {
    std::istringstream s(pm);
    std::string m;
    while (std::getline(s, m, ',')) modes.push_back(m);
  } else {
    modes = {"fsfile-4k", "img1-4k",     "img2iov-4k", "img2io-4k",    "staged-4k",
             "al1-4k",    "fsfile-huge", "img1-huge",  "img2iov-huge", "img2io-huge"};
  }
  printf("objects %zu x %zu KiB, threads %d, rounds %d, crc %d, modes in order: ", n, obj / 1024, threads, rounds,
         int(crc));
  for (auto& m : modes) printf("%s ", m.c_str());
  printf("\n");

  std::map<std::string, std::vector<double>> rate, ratio, reqs;
  for (int r = 0; r < rounds; r++) {
    std::vector<std::string> order = modes;
    if (r % 2) std::reverse(order.begin(), order.end());
    std::map<std::string, double> this_round;
    for (const std::string& mode : order) {
      const auto dash = mode.rfind('-'), slash = mode.find('/');
      crc = crc_env && slash == std::string::npos;
      const ReadFn& fn = ways.at(mode.substr(0, dash));
      const std::string mem = mode.substr(dash + 1, slash == std::string::npos ? std::string::npos : slash - dash - 1);
      Mem& m = mems.at(mem[0] == 's' ? "huge" : mem);  // sN: staging of the huge set
      std::vector<std::vector<iovec>> dsts;
      for (size_t k = 0; k < n; k++) dsts.push_back(dst_of(mem, k));
      std::atomic<size_t> next{0};
      std::atomic<bool> bad{false};
      const uint64_t r0 = disk_reads(dev);
      auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; t++)
        ts.emplace_back([&, t] {
          for (size_t k; (k = next++) < n;)
            if (!fn(t, k, dsts[k], m.staging[t])) bad = true;
        });
      for (auto& t : ts) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const uint64_t r1 = disk_reads(dev);
      if (bad) {
        fprintf(stderr, "%s: a read failed or its check did not match\n", mode.c_str());
        return 1;
      }
      const double mibs = double(n * obj) / s / (1 << 20);
      this_round[mode] = mibs;
      rate[mode].push_back(mibs);
      reqs[mode].push_back(double(r1 - r0) / n);
      printf("round %d %-13s %8.0f MiB/s  %5.2f disk reads/object\n", r, mode.c_str(), mibs, double(r1 - r0) / n);
    }
    for (auto& [mode, v] : this_round) ratio[mode].push_back(v / this_round[modes[0]]);
    fflush(stdout);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  printf("\n| mode | median MiB/s | median of per-round / %s | min..max ratio | disk reads/object |\n",
         modes[0].c_str());
  printf("|---|---:|---:|---|---:|\n");
  for (auto& mode : modes) {
    auto& q = ratio[mode];
    printf("| %s | %.0f | %.2fx | %.2f..%.2f | %.2f |\n", mode.c_str(), median(rate[mode]), median(q),
           *std::min_element(q.begin(), q.end()), *std::max_element(q.begin(), q.end()), median(reqs[mode]));
  }
  close(fimg);
  close(fal);
  if (getenv("KEEP")) return 0;  // the files stay (filefrag)
  unlink(img.c_str());
  unlink(al.c_str());
  for (size_t k = 0; k < n; k++) unlink((dir + "/obj" + std::to_string(k) + ".data").c_str());
  return 0;
}
