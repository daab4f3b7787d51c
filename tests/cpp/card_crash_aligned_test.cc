// SPDX-License-Identifier: Apache-2.0
// Crash consistency of the card store's stores from 4 KiB-aligned memory
// (LMCache's buffers are page-aligned), on a fault-injecting device. Built
// and run by tests/store/test_crash_consistency.py; the harness and its
// checks after each reopen are tests/cpp/crash_harness.h (card_crash_test.cc
// runs it on values that are not aligned, which the store stages).
//
//   card_crash_aligned_test [all | quick]
//
// A scripted workload of aligned stores that takes every aligned store path
// of CardStore::put_each (src_cpp/store/card_store_put.cc):
//   - under kOverlapCrcBytes (1 MiB): header, body and tail block in one
//     vectored write, the CRC computed first (4 KiB, 12 KiB + 100 B,
//     200-300 KiB);
//   - 1 MiB and more: the body (and tail) first while the CrcWorker
//     checksums it, then the header block (1 MiB, 1 MiB + 3 B, 2 MiB +
//     1000 B: in 1.5 MiB regions the last always continues into the next);
//   - on a memory-backed device (a tmpfs card, without its mapping): the
//     body in 1 MiB pieces, then the header (write_in_pieces);
// with supersedes (a store replacing an older copy of its key, aligned and
// staged, in one batch and across batches), deletes between them, loads,
// and eviction of the regions they filled. On each device, at every write
// point: a power cut (whole; torn after the write's first block, and after
// its 128th, inside a large body; keeping a seeded subset of the unsynced
// writes), a process crash (every write before it kept: a header written
// before its body is caught here) and that write failed (whole, torn as the
// cuts); and every sync failed in turn. The default runs every write point of the disk workload
// and a bounded set of the memory-backed one's; `all` (or ADP_CRASH_ALL=1)
// every point of both; `quick` (the sanitizer builds) 4 write points and 2
// sync points of each.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check.h"
#include "crash_harness.h"

namespace {

using namespace adp::testing::crash;  // NOLINT: the harness's workload, checks and crashes

constexpr size_t kK = 1024, kM = 1024 * 1024;
// A cut or failed write torn here: inside a 1 MiB body, after a small write's end (it lands whole).
constexpr uint64_t kLaterTear = 128 * adp::kBlockSize;

Op put(int writer, std::vector<int> keys, std::vector<size_t> sizes, bool aligned = true) {
  return Op{Op::kPut, writer, std::move(keys), std::move(sizes), aligned};
}
Op del(int writer, int key) { return Op{Op::kDelete, writer, {key}, {}, false}; }
Op get(int writer, int key) { return Op{Op::kGet, writer, {key}, {}, false}; }

// Regions of 1.5 MiB, eight of them (12 MiB): the script writes some 18 MiB,
// the last of it more live data than the card holds: regions are evicted.
std::vector<Op> make_aligned_script() {
  return {
      put(0, {0}, {4 * kK}),                              // small, one block, no tail
      put(1, {9}, {8 * kK}),                              // never replaced: evicted with the first region
      put(1, {1}, {1 * kM}),                              // body then header, no tail
      put(2, {2}, {12 * kK + 100}),                       // small, tail block
      put(0, {3}, {2 * kM + 1000}),                       // body then header, tail, continues into the next region
      get(1, 1),                                          //
      put(1, {1}, {1 * kM + 3}),                          // supersedes a large copy with a large one
      del(2, 0),                                          //
      put(0, {0}, {300 * kK + 1}),                        // re-stored after its delete
      put(2, {2, 4, 2}, {200 * kK + 1, 1 * kM, 8 * kK}),  // one batch: both paths, key 2 twice
      del(1, 3),                                          //
      put(0, {3}, {2 * kM + 1000}),                       //
      put(1, {5}, {5000}, false),                         // staged (not aligned) ...
      put(2, {5}, {64 * kK}),                             // ... superseded by an aligned small copy
      put(0, {1}, {40 * kK + 5}, false),                  // an aligned large copy superseded by a staged one
      del(1, 4),                                          //
      put(2, {6}, {1 * kM}),                              //
      put(0, {7}, {2 * kM + 4 * kK + 17}),                //
      put(1, {4}, {1 * kM + 4 * kK}),                     //
      del(2, 1),                                          //
      put(0, {6}, {4 * kK}),                              // a large copy superseded by a small one
      get(1, 7),                                          //
      put(2, {0, 8}, {1 * kM + 1, 16 * kK}),              //
      put(1, {10}, {2 * kM + 1000}),                      // more live than the card holds: evictions
      put(2, {11}, {2 * kM + 1000}),                      //
      put(0, {12}, {1 * kM + 1}),                         //
  };
}

}  // namespace

int main(int argc, char** argv) {
  const Selection sel = crash_program_start(argc, argv);
  const bool all = sel.all, quick = sel.quick;
  auto ops = make_aligned_script();
  int small = 0, large = 0, staged = 0;
  for (const Op& op : ops)
    for (size_t s : op.sizes) (!op.aligned ? staged : s >= kM ? large : small)++;
  std::printf("card_crash_aligned_test: %d aligned stores under 1 MiB, %d of 1 MiB or more, %d staged\n", small, large,
              staged);
  crash_card() = CrashCard{1536 * kK, 8, false};
  // Each write point: every crash of crashes_at, with a cut and a failed write torn inside a large body too.
  auto at = [&](uint64_t p, uint64_t) { return crashes_at(ops, p, kLaterTear); };
  Coverage disk = crash_everywhere(ops, "disk", quick ? 4 : 0, quick ? 2 : 0, at);
  crash_card().memory_backed = true;
  Coverage mem = crash_everywhere(ops, "memory-backed", all ? 0 : quick ? 4 : 12, quick ? 2 : 0, at);
  CHECK(quick || disk.points == disk.writes, "every write point of the disk workload runs");
  std::printf("card_crash_aligned_test: disk: %s %" PRIu64 " write points; memory-backed: %" PRIu64 " of %" PRIu64
              " (%s); %" PRIu64 " runs, %d failures; %" PRIu64 " reopens checked for damage counted (none may be)\n",
              quick ? "quick, 4 of" : "all", disk.writes, mem.points, mem.writes,
              all     ? "all"
              : quick ? "quick"
                      : "bounded; ADP_CRASH_ALL=1 for all",
              disk.runs + mem.runs, adp::testing::check_failures, damage_checked);
  return adp::testing::finish("card_crash_aligned_test");
}
