// SPDX-License-Identifier: Apache-2.0
// Probe for issue 10 item 3 on disk (session 32, brief disk32): where ADP's
// 256 KiB stores in bench_l2 lose to fio's O_DIRECT write at QD4. It writes
// the pattern of each with raw O_DIRECT pwritev on one prefilled file, 4
// threads, PASS_MiB a mode (2 GiB: bench_l2's phase), and prices each step
// from fio's stream to what the card does:
//  F) fio's job: each thread streams its own slice, OBJ-sized writes, no sync,
//     one fdatasync at the end (fio --end_fsync=1)
//  R) bench_l2's rounds: each thread writes ROUND/threads (a round: 4 batches
//     of 32 keys, 32 MiB at 256 KiB; each worker ~one quarter), then all wait
//     for each other (the bench awaits the 4 batches before the next round)
//  S) R + one fdatasync a thread a round (the put_slices sync before the ack)
//  A) the card: one frontier every thread appends to (header block + payload
//     in one pwritev of OBJ + 4 KiB), CRC32C of the payload before its write,
//     one fdatasync a thread a round, and every REGION bytes a region opened
//     under the frontier lock (4 KiB header write + fdatasync: advance_frontier,
//     while no other thread can reserve)
//  N) A without the region-open sync (its header write kept)
//  P) A without any sync (durable=false)
//  C) A without the CRC
//  O) A with each object's CRC computed on the IoContext's CrcWorker
//     (util/crc_worker.cc) while the previous object of the thread is written
//     (the first of a round's before its write, as A)
//  L) R with the card's write size: header block + payload in one pwritev
//     (OBJ + 4 KiB) in the thread's own slice, no sync
//  M) R with the card's shared frontier: OBJ-sized writes appended by every
//     thread to one sequence (no header, no region, no sync)
// Session 35 (brief disk35): when a worker syncs. A thread's round is bench_l2's
// 4 worker slices (SLICE_OBJS objects each: a batch of 32 keys over 4 workers,
// 8 objects), and every sync goes through the card's group commit
// (util/group_sync.cc: issue/wrote counted around each write, a thread's mark
// noted before the first write the sync covers), as device_->sync does:
//  T) A with a sync after every slice (a store acknowledged per slice: what
//     a worker does that takes one slice at a time)
//  J) A with a sync after every 2 slices (a worker that writes the next slice
//     before it syncs, K = 2)
//  K) A with a sync after every 4 slices, i.e. one a thread a round (K = 4;
//     A's schedule, through the group commit)
// Rate: the median round's (bench_l2's "median round") and the whole pass's; at the end, every mode's median
// round over all passes (QUIET=1: that alone).
// Each pass runs every mode once, every other pass in reverse order.
// Build (from the repository root):
//   g++ -O2 -std=c++20 -march=native -pthread -Isrc_cpp -o /tmp/sdr benchmarks/probes/store_disk_rounds.cc
//   src_cpp/util/crc32c.cc src_cpp/util/crc_worker.cc src_cpp/util/group_sync.cc src_cpp/util/status.cc
// Run: /tmp/sdr FILE [PASSES] (FILE prefilled with PASS_MiB + 64 MiB, e.g. dd
// if=/dev/zero of=FILE bs=64M count=33 oflag=direct); env OBJ_KiB (256),
// THREADS (4), ROUND_MiB (32), REGION_MiB (32), PASS_MiB (2048), SLICE_OBJS (8), PROBE_MODES.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "util/crc32c.h"
#include "util/crc_worker.h"
#include "util/group_sync.h"

namespace {
using Clock = std::chrono::steady_clock;

size_t env_or(const char* name, size_t dflt) {
  const char* v = getenv(name);
  return v ? strtoull(v, nullptr, 10) : dflt;
}

struct Mode {
  char name;
  bool rounds, sync, card, region_sync, crc, header, shared, overlap = false;
  size_t sync_slices = 0;  // 0: a sync a thread a round (sync); n: one after every n slices, through GroupSync
};
const Mode kModes[] = {
    {'F', false, false, false, false, false, false, false},
    {'R', true, false, false, false, false, false, false},
    {'S', true, true, false, false, false, false, false},
    {'A', true, true, true, true, true, true, true},
    {'N', true, true, true, false, true, true, true},
    {'P', true, false, true, false, true, true, true},
    {'C', true, true, true, true, false, true, true},
    {'L', true, false, false, false, false, true, false},
    {'M', true, false, false, false, false, false, true},
    {'O', true, true, true, true, true, true, true, true},
    {'T', true, false, true, true, true, true, true, false, 1},
    {'J', true, false, true, true, true, true, true, false, 2},
    {'K', true, false, true, true, true, true, true, false, 4},
};
constexpr int kNumModes = sizeof kModes / sizeof kModes[0];

void check(bool ok, const char* what) {
  if (!ok) {
    perror(what);
    exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE [PASSES]\n", argv[0]);
    return 1;
  }
  const size_t obj = env_or("OBJ_KiB", 256) << 10, threads = env_or("THREADS", 4);
  const size_t round = env_or("ROUND_MiB", 32) << 20, region = env_or("REGION_MiB", 32) << 20;
  const size_t pass = env_or("PASS_MiB", 2048) << 20, blk = 4096;
  const size_t per_round = round / threads / obj;  // objects a thread a round
  const size_t rounds = pass / round;
  const size_t slice_objs = env_or("SLICE_OBJS", 8);
  const int passes = argc > 2 ? atoi(argv[2]) : 3;
  std::vector<int> order;
  if (const char* m = getenv("PROBE_MODES")) {
    for (const char* c = m; *c; c++)
      for (int i = 0; i < kNumModes; i++)
        if (kModes[i].name == *c) order.push_back(i);
  } else {
    for (int i = 0; i < kNumModes; i++) order.push_back(i);
  }
  const int fd = open(argv[1], O_WRONLY | O_DIRECT);
  check(fd >= 0, argv[1]);
  // The source: a round's objects (as an L1 of a round), 4 KiB aligned, warm; a header block a thread.
  const size_t src_bytes = threads * per_round * obj;
  auto* src = static_cast<uint8_t*>(aligned_alloc(2 << 20, src_bytes));
  memset(src, 7, src_bytes);
  auto* hdrs = static_cast<uint8_t*>(aligned_alloc(blk, threads * blk * 2));
  memset(hdrs, 1, threads * blk * 2);
  printf("# obj %zu KiB, %zu threads, round %zu MiB (%zu objects a thread), region %zu MiB, pass %zu MiB\n", obj >> 10,
         threads, round >> 20, per_round, region >> 20, pass >> 20);
  std::vector<std::vector<double>> all_rounds(kNumModes);  // every round's seconds, by mode
  for (int p = 0; p < passes; p++) {
    std::vector<int> mine = order;
    if (p % 2) std::reverse(mine.begin(), mine.end());
    for (int mi : mine) {
      const Mode& m = kModes[mi];
      std::vector<double> round_s(rounds, 0.0);
      std::atomic<uint64_t> frontier{0}, syncs{0}, region_opens{0};
      std::mutex frontier_mu;
      adp::GroupSync group;
      const adp::GroupSync::Flush flush = [&] {
        return fdatasync(fd) == 0 ? adp::Status::Ok() : adp::Status::IoError("fdatasync failed");
      };
      uint64_t next_region = 0;  // the frontier offset at which the next region opens (under frontier_mu)
      Clock::time_point round_start = Clock::now();
      size_t round_no = 0;
      std::barrier sync_point(static_cast<ptrdiff_t>(threads), [&]() noexcept {
        const Clock::time_point now = Clock::now();
        if (round_no < rounds) round_s[round_no++] = std::chrono::duration<double>(now - round_start).count();
        round_start = now;
      });
      const size_t slice = pass / threads;
      const auto t0 = Clock::now();
      std::vector<std::thread> ts;
      for (size_t t = 0; t < threads; t++)
        ts.emplace_back([&, t] {
          uint8_t* hdr = hdrs + t * blk * 2;
          adp::CrcWorker worker;
          size_t done = 0;  // objects this thread wrote
          const bool grouped = m.sync_slices != 0;
          uint64_t since = group.mark();  // before the first write the next sync covers
          for (size_t r = 0; r < rounds; r++) {
            for (size_t k = 0; k < per_round; k++, done++) {
              const uint8_t* data = src + (t * per_round + k) * obj;
              ssize_t want;
              ssize_t got;
              if (!m.card) {
                const size_t hb = m.header ? blk : 0;
                const uint64_t at = m.shared ? frontier.fetch_add(obj + hb) : t * slice + done * (obj + hb);
                iovec iov[2] = {{hdr, hb}, {const_cast<uint8_t*>(data), obj}};
                want = static_cast<ssize_t>(obj + hb);
                got = m.header ? pwritev(fd, iov, 2, static_cast<off_t>(at % pass))
                               : pwrite(fd, data, obj, static_cast<off_t>(at % pass));
              } else {
                uint64_t at;
                {
                  std::lock_guard<std::mutex> lock(frontier_mu);
                  at = frontier.fetch_add(obj + blk);
                  if (at + obj + blk > next_region) {  // the next region opens: header, sync, under the lock
                    next_region += region;
                    region_opens++;
                    const uint64_t region_mark = group.mark();  // the region's open_mark
                    if (grouped) group.issue();
                    check(pwrite(fd, hdr, blk, static_cast<off_t>((next_region - region) % pass)) == ssize_t(blk),
                          "region header");
                    if (grouped) {
                      group.wrote();
                      check(group.sync(flush, region_mark).ok(), "group sync");
                    } else if (m.region_sync) {
                      check(fdatasync(fd) == 0, "fdatasync"), syncs++;
                    }
                  }
                }
                if (m.overlap) {  // this object's CRC was started with the previous write (or is started now)
                  if (k == 0) worker.start(data, obj);
                  const uint32_t c = worker.wait();
                  memcpy(hdr, &c, 4);
                  if (k + 1 < per_round) worker.start(data + obj, obj);  // the next, while this one is written
                } else if (m.crc) {
                  const uint32_t c = adp::crc32c(data, obj);
                  memcpy(hdr, &c, 4);
                }
                iovec iov[2] = {{hdr, blk}, {const_cast<uint8_t*>(data), obj}};
                want = static_cast<ssize_t>(obj + blk);
                if (grouped) group.issue();
                got = pwritev(fd, iov, 2, static_cast<off_t>(at % pass));
                if (grouped) group.wrote();
              }
              check(got == want, "pwrite");
              if (grouped && (k + 1) % (slice_objs * m.sync_slices) == 0) {  // the slices' sync, then the next
                check(group.sync(flush, since).ok(), "group sync");
                since = group.mark();
              }
            }
            if (m.sync) check(fdatasync(fd) == 0, "fdatasync"), syncs++;
            if (m.rounds) sync_point.arrive_and_wait();
          }
        });
      for (auto& t : ts) t.join();
      if (!m.rounds) check(fdatasync(fd) == 0, "fdatasync");
      const double whole = std::chrono::duration<double>(Clock::now() - t0).count();
      double median = 0;
      if (m.rounds) {
        std::vector<double> s = round_s;
        std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
        median = s[s.size() / 2];
      }
      all_rounds[mi].insert(all_rounds[mi].end(), round_s.begin(), round_s.end());
      if (m.sync_slices) syncs = group.flushes();
      if (getenv("QUIET")) continue;
      printf("pass %d mode %c: whole %.0f MiB/s, median round %s MiB/s, syncs %lu, region opens %lu\n", p + 1, m.name,
             pass / 1048576.0 / whole, m.rounds ? std::to_string(int(round / 1048576.0 / median)).c_str() : "-",
             static_cast<unsigned long>(syncs.load()), static_cast<unsigned long>(region_opens.load()));
      fflush(stdout);
    }
  }
  // Over every pass: the median round of each mode (short passes, many of them, interleave the modes finely
  // enough that the disk's slow spells fall on all of them alike).
  for (int mi : order) {
    std::vector<double> s = all_rounds[mi];
    if (!kModes[mi].rounds || s.empty()) continue;
    std::sort(s.begin(), s.end());
    auto at = [&](double q) { return round / 1048576.0 / s[size_t(q * (s.size() - 1))]; };
    printf("mode %c over %zu rounds: median round %.0f MiB/s (p25 %.0f, p75 %.0f)\n", kModes[mi].name, s.size(),
           at(0.5), at(0.75), at(0.25));
  }
  close(fd);
  return 0;
}
