// SPDX-License-Identifier: Apache-2.0
// Crash consistency of the card store's stores from a fill (PutItem::fill,
// the gateway's path: CardStore::write_filled) and of a tmpfs card's mapped
// store path, on the crash harness (tests/cpp/crash_harness.h). Built and
// run by tests/store/test_crash_consistency.py.
//
//   card_crash_fill_test [all | quick]
//
// A scripted workload of fills with pointer stores between them:
//   - fills of one staged piece or less (4 MiB: kGuardedPieceBytes): header
//     and payload in one write (5000 B, 1 MiB + 3 B, 2 MiB + 1000 B, which
//     continues into the next region);
//   - larger fills: staged pieces of 4 MiB, then the header (4 MiB + 5000 B,
//     4 MiB + 4 KiB: they span three or four 1.5 MiB regions);
//   - fills that fail at their last piece (the source failed): the item
//     fails, nothing of it may come back, the key's older copy stays (a held
//     object is never excused by a failed fill);
//   - supersedes (a fill by a fill, a pointer store by a fill and back, a
//     large copy by a small one, a key twice in one batch), deletes, loads,
//     and more than the card holds (regions evicted);
// on two devices:
//   - disk-like (fills staged): at a write point a power cut (whole; torn
//     after the write's first block, and after its 128th, inside a large
//     piece; keeping a seeded subset of the unsynced writes), a process crash
//     and that write failed (whole, torn as the cuts); syncs failed in turn;
//   - a tmpfs card with its mapping (testing/mapped_fault_device.h): every
//     payload copy into the mapping is a write point (a fill's 256 KiB
//     pieces and its tail block; a pointer store's copy per region it
//     spans), as are the writes of headers, pads and tombstones. At a point,
//     a process crash (every copy and write before it kept, in the order
//     made: a record's header must come after its payload), whole and torn
//     after the first block; syncs failed in turn. A power cut loses a tmpfs
//     card whole: not a case here.
// Default: a process crash at every write point of both (the fault that shows
// a header written before its payload); every crash at 16 write points of the
// disk workload spread over it; 16 sync points of each. `all` (or
// ADP_CRASH_ALL=1): every crash at every point, every sync. `quick` (the
// sanitizer builds): every crash at 4 write points and 2 sync points of each.
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
constexpr uint64_t kLaterTear = 128 * adp::kBlockSize;  // inside a 4 MiB staged piece

Op fill(int writer, std::vector<int> keys, std::vector<size_t> sizes) {
  return Op{Op::kPut, writer, std::move(keys), std::move(sizes), false, Op::kFill};
}
Op failing(int writer, int key, size_t size) { return Op{Op::kPut, writer, {key}, {size}, false, Op::kFailingFill}; }
Op put(int writer, int key, size_t size, bool aligned) { return Op{Op::kPut, writer, {key}, {size}, aligned}; }
Op del(int writer, int key) { return Op{Op::kDelete, writer, {key}, {}, false}; }
Op get(int writer, int key) { return Op{Op::kGet, writer, {key}, {}, false}; }

// Regions of 1.5 MiB, eight of them (12 MiB); the script stores some 30 MiB, the last of it more live data than
// the card holds: regions are evicted.
std::vector<Op> make_fill_script() {
  return {
      fill(0, {0}, {5000}),                             // one staged write, header included
      fill(1, {1}, {1 * kM + 3}),                       //
      put(2, 2, 300 * kK + 1, false),                   // a pointer store (staged)
      fill(0, {3}, {4 * kM + 5000}),                    // 4 MiB pieces, then the header; spans three or four regions
      get(1, 3),                                        //
      fill(1, {1}, {2 * kM + 1000}),                    // a fill superseding a fill; continues into the next region
      failing(2, 2, 1 * kM),                            // fails at its last piece: key 2's copy stays
      failing(0, 3, 4 * kM + 600 * kK),                 // its first 4 MiB piece written, then fails
      del(1, 0),                                        //
      fill(2, {0, 5, 0}, {8, 12 * kK + 100, 64 * kK}),  // one batch, key 0 twice
      put(0, 5, 40 * kK, true),                         // an aligned pointer store superseding a fill
      fill(1, {2}, {600 * kK}),                         // a fill superseding a pointer store
      del(2, 1),                                        //
      fill(0, {6}, {3 * kM}),                           //
      put(1, 6, 1 * kM + 5, true),                      // aligned, 1 MiB and more, superseding a fill
      fill(2, {6}, {4 * kM + 4 * kK}),                  // a fill in pieces superseding a pointer store
      fill(0, {3}, {200 * kK}),                         // a small fill superseding a large one
      failing(1, 6, 4 * kK),                            // a one-piece fill failing
      get(2, 6),                                        //
      fill(2, {9}, {2 * kM + 1000}),                    // more than the card holds: evictions
      fill(0, {10}, {1 * kM}),                          //
  };
}

}  // namespace

int main(int argc, char** argv) {
  const Selection sel = crash_program_start(argc, argv);
  const bool all = sel.all, quick = sel.quick;
  auto ops = make_fill_script();
  int fills = 0, failing_fills = 0, pointers = 0;
  for (const Op& op : ops)
    if (op.kind == Op::kPut)
      (op.source == Op::kFill          ? fills
       : op.source == Op::kFailingFill ? failing_fills
                                       : pointers) += static_cast<int>(op.keys.size());
  std::printf("card_crash_fill_test: %d fills, %d failing fills, %d pointer stores\n", fills, failing_fills, pointers);
  crash_card() = CrashCard{1536 * kK, 8, false, false};
  // Every write point gets a process crash (the fault where the order of a store's own writes shows: a header
  // before its payload); `full` of them spread over the disk workload every crash of crashes_at (all in `all`);
  // the mapped card's a torn one too in `all`. `quick`: 4 points of each, every crash there.
  const uint64_t full = all ? 0 : 16, syncs = all ? 0 : quick ? 2 : 16, points = quick ? 4 : 0;
  auto every_crash = [&](uint64_t p, uint64_t writes) {
    return quick || !full || p * full / writes != (p + 1) * full / writes;
  };
  uint64_t full_here = 0;  // of them, crashed at here (crash_shard())
  Coverage disk = crash_everywhere(ops, "disk", points, syncs, [&](uint64_t p, uint64_t writes) -> uint64_t {
    if (every_crash(p, writes)) {
      full_here++;
      return crashes_at(ops, p, kLaterTear);
    }
    cut_keeping_at(ops, p, true);
    return 1;
  });
  uint64_t full_points = 0;  // the points of the selection with every crash
  for (uint64_t i = 0; i < disk.points; i++) full_points += every_crash(i * disk.writes / disk.points, disk.writes);
  shard_line("disk", full_here, full_points, "points with every crash");
  crash_card().mapped = true;
  Coverage map = crash_everywhere(ops, "mapped", points, syncs, [&](uint64_t p, uint64_t) -> uint64_t {
    cut_keeping_at(ops, p, true);
    if (!all && !quick) return 1;
    cut_at(ops, p, adp::kBlockSize);  // (on the mapped card every cut keeps the writes before it)
    return 2;
  });
  std::printf("card_crash_fill_test: disk: %" PRIu64 " of %" PRIu64 " write points (every crash at %" PRIu64
              "); mapped: %" PRIu64 " of %" PRIu64 " (%s); %" PRIu64 " runs, %d failures; %" PRIu64
              " reopens checked for damage counted (none may be)\n",
              disk.points, disk.writes, full_points, map.points, map.writes,
              all     ? "all"
              : quick ? "quick"
                      : "process crash only; ADP_CRASH_ALL=1 for all",
              disk.runs + map.runs, adp::testing::check_failures, damage_checked);
  return adp::testing::finish("card_crash_fill_test");
}
