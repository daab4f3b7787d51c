// SPDX-License-Identifier: Apache-2.0
// The crash harness of tests/cpp/card_crash_test.cc and
// tests/cpp/card_crash_aligned_test.cc: a scripted workload of stores,
// supersedes, deletes and loads (three writers, each with its own IoContext)
// run on a card on a fault-injecting device (src_cpp/testing/fault_device.h)
// with one fault armed (a power cut at a write, whole, torn at a block
// boundary, or keeping a seeded subset of the unsynced writes; a process crash
// at a write, every write before it kept; a failed write or sync), then the
// card reopened and checked:
//   - every key is absent, or holds byte-exact the value of its last
//     acknowledged store, or of a store attempted after it that was never
//     acknowledged: no deleted key and no superseded copy comes back, nothing
//     torn is served;
//   - every object the store held (indexed) when the power went is back
//     (unless a delete of its key failed; after a torn cut, or one keeping
//     some unsynced writes, also unless a newer store of its key was
//     attempted: its writes may land in part or in any order, its header
//     without its body; after a process crash, a whole cut, a failed write
//     or sync, always: a store's header is its last write);
//   - stats: objects and used_bytes match what is found; no damage is
//     counted (recovery_damaged_regions 0: a crash only cuts writes);
//   - the card stores and loads after the reopen.
// The card's geometry and device (disk-like; memory-backed: a tmpfs card's
// store path without its mapping; or mapped: a tmpfs card with its mapping,
// each payload copy into it a write point) are crash_card(); an Op's values
// come from 4 KiB-aligned memory when it says so (the store's zero-copy
// paths, as LMCache's page-aligned buffers take), else from memory that is
// not, or from a fill (PutItem::fill, the gateway's path).
#pragma once

#include <malloc.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_format.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"
#include "testing/mapped_fault_device.h"

namespace adp::testing::crash {

using adp::CardOptions;
using adp::CardStore;
using adp::IoContext;
using adp::Status;

// The card the harness opens: regions of region_bytes, on a FaultDevice or,
// with memory_backed, on one that says it is memory (the store then writes
// aligned values in pieces, header last: CardStore::write_in_pieces).
// With mapped, on a MappedFaultDevice (a tmpfs card with its mapping: payloads copied into it, each copy a
// write point); every fault there is a process crash (a power cut loses a tmpfs card whole), the power cut that
// ends a run included.
struct CrashCard {
  uint64_t region_bytes = 1ull << 20;
  uint64_t regions = 10;
  bool memory_backed = false;
  bool mapped = false;
};

inline CrashCard& crash_card() {
  static CrashCard card;
  return card;
}

// A FaultDevice that says it is memory (an image on tmpfs), without mapping
// itself: every write still goes through writev, where faults are injected.
class MemoryFaultDevice : public FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  bool memory_backed() const override { return true; }
};

constexpr int kKeys = 48;
constexpr int kWriters = 3;

inline std::string key_name(int k) { return "key-" + std::to_string(k); }

// The bytes of value v (unique per store): its id, then a pattern of it.
inline std::vector<uint8_t> value_bytes(uint64_t v, size_t size) {
  std::vector<uint8_t> b(size);
  std::mt19937_64 g(v * 7919 + 17);
  for (size_t i = 0; i < size; i += 8) {
    uint64_t x = g();
    std::memcpy(b.data() + i, &x, std::min<size_t>(8, size - i));
  }
  if (size >= 8) std::memcpy(b.data(), &v, 8);
  return b;
}

struct Op {
  enum Kind { kPut, kDelete, kGet } kind;
  int writer;
  std::vector<int> keys;  // put: 1..3 keys, one value each
  std::vector<size_t> sizes;
  bool aligned = false;  // put: the values in 4 KiB-aligned memory
  // put: the values given as pointers, or from a fill (PutItem::fill, the gateway's path:
  // CardStore::write_filled), or from a fill that fails at its last piece (the item fails; nothing of it may show).
  enum Source { kPointer, kFill, kFailingFill } source = kPointer;
};

// A fill of `value`'s bytes; failing: it fails when asked for its last bytes (the store's last fill piece).
inline adp::FillFn fill_of(const std::vector<uint8_t>& value, bool failing) {
  return [&value, failing](uint8_t* dst, uint64_t off, size_t len) {
    if (failing && off + len == value.size()) return Status::IoError("the source failed");
    std::memcpy(dst, value.data() + off, len);
    return Status::Ok();
  };
}

// What the test knows of a key: the last acknowledged state and the stores
// attempted since without acknowledgement.
struct KeyModel {
  std::optional<uint64_t> acked;  // value id, or none (never stored, or deleted)
  size_t acked_size = 0;
  std::map<uint64_t, size_t> unacked;  // value id -> size
  bool delete_unacked = false;         // a delete was attempted since, and failed
};

struct Run {
  std::map<int, KeyModel> model;
  std::map<int, std::pair<uint64_t, size_t>> held;  // indexed when the power went: key -> value, size
  uint64_t writes = 0;
  // No write landed in part or out of order (a process crash, every write
  // before it kept; a whole cut; a failed write or sync): a store is on the
  // card whole or has no header, so a held object is never lost to a newer
  // store of its key that was not acknowledged.
  bool strict = false;
};

// The store on a new device over `image` (a failure a CHECK: "<what>: <why>"), or nullptr; *dev: the device.
inline std::unique_ptr<CardStore> open_store(const std::shared_ptr<FaultImage>& image, const std::string& what,
                                             FaultDevice** dev = nullptr) {
  CardOptions co = card_options(crash_card().region_bytes);
  co.recovery_threads = 2;
  if (crash_card().mapped) {
    MappedFaultDevice* md = nullptr;
    auto s = checked_fault_card(image, co, what, &md, "crash-card");
    if (md) md->keep_all_unsynced_at_cut();  // any cut is the process gone: the page cache keeps its writes
    if (dev) *dev = md;
    return s;
  }
  if (!crash_card().memory_backed) return checked_fault_card(image, co, what, dev, "crash-card");
  MemoryFaultDevice* md = nullptr;
  auto s = checked_fault_card(image, co, what, &md, "crash-card");
  if (dev) *dev = md;
  return s;
}

// Runs the script on an opened store. The device may die (power cut) or fail
// one write on the way; the model records what was acknowledged.
inline void run_script(CardStore& s, FaultDevice& dev, const std::vector<Op>& ops, Run* run) {
  std::vector<std::unique_ptr<IoContext>> ctx;
  for (int w = 0; w < kWriters; w++) ctx.push_back(std::make_unique<IoContext>());
  uint64_t next_value = 1;
  for (const Op& op : ops) {
    IoContext& c = *ctx[op.writer];
    // A store or delete begun on a dead device (after a cut) reaches nothing: it excuses no loss.
    const bool attempted = !dev.dead();
    if (op.kind == Op::kPut) {
      std::vector<std::vector<uint8_t>> bufs;
      std::vector<adp::PutItem> items;
      std::vector<std::string> names;
      std::vector<uint64_t> ids;
      for (size_t j = 0; j < op.keys.size(); j++) {
        ids.push_back(next_value++);
        bufs.push_back(value_bytes(ids.back(), op.sizes[j]));
        names.push_back(key_name(op.keys[j]));
      }
      // A copy in page-aligned memory (aligned: the store writes it without staging), or 16 bytes past a page
      // boundary (not aligned: staged). Never where the allocator put the vector: glibc's malloc serves a
      // large one 16 bytes past a page, TSan's allocator at a page, so under TSan the values meant to be
      // staged took the aligned paths (the spanning workload's 1.5 MiB ones body then header, a write more
      // each: 85 write points against the plain build's 81; docs/testing.md).
      std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> copies;
      for (size_t j = 0; j < op.keys.size(); j++) {
        const size_t skew = op.aligned ? 0 : 16;
        size_t n = (skew + bufs[j].size() + kBlockSize - 1) / kBlockSize * kBlockSize;
        copies.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kBlockSize, n)), &std::free);
        CHECK(copies.back() != nullptr, "aligned_alloc of %zu bytes failed", n);
        if (!copies.back()) std::exit(1);
        uint8_t* data = copies.back().get() + skew;
        std::memcpy(data, bufs[j].data(), bufs[j].size());
        items.push_back({names[j], data, bufs[j].size()});
        if (op.source != Op::kPointer)
          items.back() = {names[j], nullptr, bufs[j].size(), fill_of(bufs[j], op.source == Op::kFailingFill)};
      }
      std::vector<Status> results(items.size());
      s.put(c, items.data(), items.size(), results.data(), [] { return true; });
      // A failed fill's store never reaches the card as an object (no header over its payload): it
      // supersedes nothing, and excuses no loss.
      const bool never = op.source == Op::kFailingFill;
      for (size_t j = 0; j < op.keys.size(); j++) {
        KeyModel& m = run->model[op.keys[j]];
        CHECK(!never || !results[j].ok(), "a store whose fill failed was acknowledged (key %d)", op.keys[j]);
        if (never) continue;
        if (results[j].ok()) {
          m.acked = ids[j];
          m.acked_size = op.sizes[j];
          m.unacked.clear();
          m.delete_unacked = false;
        } else if (attempted) {
          m.unacked[ids[j]] = op.sizes[j];
        }
      }
      // Within one batch a later item of the same key is the newer store.
      for (size_t j = 0; j < op.keys.size(); j++)
        for (size_t k = j + 1; k < op.keys.size(); k++)
          if (op.keys[j] == op.keys[k] && results[j].ok() && !results[k].ok() && attempted && !never) {
            KeyModel& m = run->model[op.keys[j]];
            m.unacked[ids[k]] = op.sizes[k];
          }
    } else if (op.kind == Op::kDelete) {
      KeyModel& m = run->model[op.keys[0]];
      bool present = s.exists(key_name(op.keys[0]));
      bool removed = s.remove(c, key_name(op.keys[0])).ok();
      if (removed) {
        m.acked.reset();
        m.unacked.clear();
        m.delete_unacked = false;
      } else if (present && attempted) {
        m.delete_unacked = true;  // failed: it may or may not have reached the card
      }
    } else {
      (void)read_object(s, c, key_name(op.keys[0]));
    }
  }
  run->writes = dev.writes();
}

// What the store holds in memory right now (after the power went: what it
// believed durable).
inline void snapshot_held(CardStore& s, FaultDevice& dev, Run* run) {
  // exists() answers from the index, without I/O.
  for (auto& [k, m] : run->model)
    if (s.exists(key_name(k)) && m.acked) run->held[k] = {*m.acked, m.acked_size};
  (void)dev;
}

inline uint64_t damage_checked = 0;  // reopens after a crash checked for no damage counted

inline void check_reopened(const std::shared_ptr<FaultImage>& image, const Run& run, const char* what, uint64_t point) {
  auto s = open_store(image, what + (" " + std::to_string(point)) + ": reopen failed");
  if (!s) return;
  IoContext ctx;
  uint64_t found = 0, footprint = 0;
  for (int k = 0; k < kKeys; k++) {
    auto got = read_object(*s, ctx, key_name(k));
    auto it = run.model.find(k);
    auto held = run.held.find(k);
    if (!got) {
      // A held object may only be missing when a delete of its key failed, or
      // a newer store of its key was attempted and failed where its writes
      // may land in part or out of order (its torn remains may win and then
      // fail their checksum: absent, never wrong); never after a strict fault.
      bool newer_attempt =
          it != run.model.end() && ((!it->second.unacked.empty() && !run.strict) || it->second.delete_unacked);
      CHECK(held == run.held.end() || newer_attempt, "%s %" PRIu64 ": key %d was held (value %" PRIu64 ") and is lost",
            what, point, k, held == run.held.end() ? 0 : held->second.first);
      continue;
    }
    found++;
    footprint += adp::object_footprint(got->size());
    uint64_t v = 0;
    if (got->size() >= 8) std::memcpy(&v, got->data(), 8);
    bool allowed = false;
    if (it != run.model.end()) {
      const KeyModel& m = it->second;
      if (m.acked && *m.acked == v && m.acked_size == got->size()) allowed = true;
      auto u = m.unacked.find(v);
      if (u != m.unacked.end() && u->second == got->size()) allowed = true;
    }
    CHECK(allowed,
          "%s %" PRIu64 ": key %d serves value %" PRIu64
          " (%zu bytes), neither its last acknowledged store nor a later one",
          what, point, k, v, got->size());
    if (allowed) CHECK(*got == value_bytes(v, got->size()), "%s %" PRIu64 ": key %d: bytes differ", what, point, k);
    if (held != run.held.end() && allowed)
      CHECK(v == held->second.first || it->second.unacked.count(v), "%s %" PRIu64 ": key %d: older copy is back", what,
            point, k);
  }
  adp::StoreStats stats = s->stats();
  CHECK(stats.objects == found, "%s %" PRIu64 ": stats say %" PRIu64 " objects, %" PRIu64 " found", what, point,
        stats.objects, found);
  CHECK(stats.used_bytes == footprint, "%s %" PRIu64 ": stats say %" PRIu64 " used bytes, objects found take %" PRIu64,
        what, point, stats.used_bytes, footprint);
  CHECK(stats.used_bytes <= stats.capacity_bytes, "%s: used beyond capacity", what);
  // A crash cuts writes; it damages nothing recovery can tell from a cut.
  CHECK(stats.recovery_damaged_regions == 0 && stats.recovery_lost_objects == 0,
        "%s %" PRIu64 ": recovery counted %" PRIu64 " damaged regions (%" PRIu64 " objects lost) after a crash", what,
        point, stats.recovery_damaged_regions, stats.recovery_lost_objects);
  damage_checked++;
  // The card still works: store and load after the reopen.
  auto b = value_bytes(999999, 5000);
  Status r = put_one(*s, ctx, "after-reopen", b);
  CHECK(r.ok() && read_object(*s, ctx, "after-reopen") == b, "%s %" PRIu64 ": card does not work after reopen: %s",
        what, point, r.message().c_str());
}

inline std::shared_ptr<FaultImage> fresh_image() {
  return std::make_shared<FaultImage>(card_bytes(crash_card().regions, crash_card().region_bytes));
}

// Runs the script on a fresh card with one fault armed by inject() (given the
// device's write and sync counts before the script), then a power cut at the
// end, and checks what the reopened card holds. The fault is at the workload's
// write `point` (or, with at_sync, its sync `point`, fail_sync's count): the
// workload must reach it, else the run tested nothing there (a point past the
// workload's end: a selection counting points the workload does not have).
inline void run_with_fault(const std::vector<Op>& ops, const std::function<void(FaultDevice*)>& inject,
                           const char* what, uint64_t point, bool strict, bool at_sync = false) {
  auto image = fresh_image();
  FaultDevice* dev;
  auto s = open_store(image, "open", &dev);
  if (!s) return;
  const uint64_t base = at_sync ? dev->syncs_run() : dev->writes();
  inject(dev);
  Run run;
  run.strict = strict || crash_card().mapped;  // on a mapped card every cut is a process crash
  run_script(*s, *dev, ops, &run);
  const uint64_t reached = (at_sync ? dev->syncs_run() : dev->writes()) - base;
  CHECK(reached > point, "%s %" PRIu64 ": the workload ran %" PRIu64 " %s: the fault was never reached", what, point,
        reached, at_sync ? "syncs" : "writes");
  snapshot_held(*s, *dev, &run);
  dev->power_cut();
  s.reset();
  check_reopened(image, run, what, point);
}

// What a cut (0) or failed write (1) torn after `tear` bytes is called in a failed check.
inline const char* torn_name(int failed, uint64_t tear) {
  static const char* const names[2][3] = {{"cut at write", "torn cut at write", "torn (later block) cut at write"},
                                          {"failed write", "torn failed write", "torn (later block) failed write"}};
  return names[failed][tear == 0 ? 0 : tear == kBlockSize ? 1 : 2];
}

// Power cut at write `point`; its first `tear` bytes (a multiple of the
// block: a block is written atomically) reach the media, all of a shorter
// write (a cut just after it, unacknowledged).
inline void cut_at(const std::vector<Op>& ops, uint64_t point, uint64_t tear) {
  run_with_fault(
      ops, [&](FaultDevice* dev) { dev->cut_power_at_write(dev->writes() + point, tear); }, torn_name(0, tear), point,
      tear == 0);
}

// A cut at write `point` that keeps writes before it: a power cut keeping a
// subset of the unsynced ones (drawn with seed `point`: they reach the media
// in any order), or, with process_crash, a process crash keeping them all.
inline void cut_keeping_at(const std::vector<Op>& ops, uint64_t point, bool process_crash) {
  run_with_fault(
      ops,
      [&](FaultDevice* dev) {
        if (process_crash)
          dev->keep_all_unsynced_at_cut();
        else
          dev->keep_unsynced_at_cut(point);
        dev->cut_power_at_write(dev->writes() + point);
      },
      process_crash ? "process crash at write" : "cut keeping some unsynced writes at write", point, process_crash);
}

// Write `point` fails, its first `tear` bytes written (as cut_at), the rest goes on.
inline void fail_at(const std::vector<Op>& ops, uint64_t point, uint64_t tear) {
  run_with_fault(
      ops, [&](FaultDevice* dev) { dev->fail_write(dev->writes() + point, tear); }, torn_name(1, tear), point,
      tear == 0);
}

// Sync `point` fails (its writes stay unsynced, a later sync may make them
// durable), the rest goes on, then a power cut at the end. A store whose
// sync failed is not acknowledged; its copy must not outlive a later
// acknowledged delete of its key.
inline void fail_sync_at(const std::vector<Op>& ops, uint64_t point) {
  run_with_fault(
      ops, [&](FaultDevice* dev) { dev->fail_sync(dev->syncs_run() + point); }, "failed sync", point, true, true);
}

// The workload's write and sync points: counted from the store's open, as run_with_fault arms its faults. The
// open's own (a fresh card's format: its superblock written and synced) come before any fault is armed, and the
// workload is never run on a card whose format failed (open_store's CHECK): they are printed apart, "(and W
// writes, S syncs at open)", not counted among the points. Nothing is written or synced after the workload: the
// power is cut before the store closes. (The workload line once printed the syncs since the device's creation,
// the open's among them, beside the points counted from the open: the fill test's "40 syncs" against its
// selection's "of 39 sync points".)
inline uint64_t count_writes(const std::vector<Op>& ops, Run* run, const char* name, uint64_t* syncs = nullptr) {
  auto image = fresh_image();
  FaultDevice* dev;
  auto s = open_store(image, "open", &dev);
  if (!s) std::exit(1);
  const uint64_t base = dev->writes(), base_syncs = dev->syncs_run();
  run_script(*s, *dev, ops, run);
  adp::StoreStats stats = s->stats();
  const uint64_t writes = dev->writes() - base, workload_syncs = dev->syncs_run() - base_syncs;
  std::printf("crash harness: %s workload: %" PRIu64 " writes, %" PRIu64 " syncs, %" PRIu64 " stores, %" PRIu64
              " deletes, %" PRIu64 " evicted objects (and %" PRIu64 " writes, %" PRIu64 " syncs at open)\n",
              name, writes, workload_syncs, stats.stores, stats.deletes, stats.evicted_objects, base, base_syncs);
  CHECK(stats.evicted_objects > 0, "the workload must evict");
  CHECK(stats.deletes > 0, "the workload must delete");
  CHECK(dev->syncs() - base_syncs == workload_syncs, "%s: a sync of the clean run failed", name);
  snapshot_held(*s, *dev, run);
  if (syncs) *syncs = workload_syncs;
  dev->power_cut();  // nothing unsynced may matter
  s.reset();
  check_reopened(image, *run, "clean run", 0);
  return writes;
}

// The crashes at write point `point` of ops: power cut there, whole and torn after its first block; cut
// keeping some of the unsynced writes; a process crash there; that write failed, whole and torn. With
// later_tear (a multiple of the block), a cut and a failed write torn there too. Returns the runs (6, or 8).
inline uint64_t crashes_at(const std::vector<Op>& ops, uint64_t point, uint64_t later_tear = 0) {
  cut_at(ops, point, 0);
  cut_at(ops, point, kBlockSize);
  cut_keeping_at(ops, point, false);
  cut_keeping_at(ops, point, true);
  fail_at(ops, point, 0);
  fail_at(ops, point, kBlockSize);
  if (!later_tear) return 6;
  cut_at(ops, point, later_tear);
  fail_at(ops, point, later_tear);
  return 8;
}

// Which points a crash program takes: `all` (argument, or ADP_CRASH_ALL=1) every one; `quick` (the
// sanitizer builds) a few; else its default selection.
struct Selection {
  bool all = false, quick = false;
};

// The share of its selection a crash program runs: with the argument `shard=K/N` (0 <= K < N), the i-th point
// of each list it would crash at (write points, sync points) runs only where
// mix(i) % N == K (mix: splitmix64's finalizer; not i % N, which gave one process every one of the fill
// test's points with every crash, every 4th), so N processes with K = 0..N-1 run the selection between them, each point
// once (tests/support/cpp.py run_split: the CI's second core). Without it (0/1) every point runs here. A process with K
// > 0 leaves out the programs' one-off scenarios (shard 0 runs them). Each list's share is printed as "crash harness:
// <list>: shard K/N ran R of S <what>" (shard_line), which run_split adds up.
// `quick` (the sanitizer builds: 4 write points and 2 sync points a list, each write point every crash) deals its
// points in turn instead, across the program's lists in the order it runs them (in_turn): the mix dealt the aligned
// test 2 of its 12 points to shard 0 and 10 to shard 1 (both lists' syncs among them); in turn each gets 6.
struct Shard {
  uint64_t index = 0, count = 1;
  bool in_turn = false;
  uint64_t dealt = 0;  // the points deal() dealt so far (in_turn)
  bool takes(uint64_t i) const {
    uint64_t z = i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) % count == index;
  }
  bool takes_in_turn(uint64_t i) const { return i % count == index; }  // the multi-writer test's seeds
  // Whether this process crashes at the i-th point of a list: called for every point of each list, in order.
  bool deal(uint64_t i) { return in_turn ? takes_in_turn(dealt++) : takes(i); }
  bool first() const { return index == 0; }
};

inline Shard& crash_shard() {
  static Shard shard;
  return shard;
}

// Reads `shard=K/N` from the arguments into crash_shard(); a malformed one ends the program (exit 2).
inline void parse_shard(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (std::strncmp(argv[i], "shard=", 6) != 0) continue;
    unsigned long long k = 0, n = 0;
    char end = 0;
    if (std::sscanf(argv[i] + 6, "%llu/%llu%c", &k, &n, &end) != 2 || n == 0 || k >= n) {
      std::fprintf(stderr, "bad argument %s: shard=K/N with 0 <= K < N\n", argv[i]);
      std::exit(2);
    }
    crash_shard() = Shard{k, n};
  }
}

inline void shard_line(const char* list, uint64_t ran, uint64_t selected, const char* what) {
  std::printf("crash harness: %s: shard %" PRIu64 "/%" PRIu64 " ran %" PRIu64 " of %" PRIu64 " %s\n", list,
              crash_shard().index, crash_shard().count, ran, selected, what);
}

// The program's selection from its arguments; and each run's image (12 MiB or so) and values (up to some
// MiB) from the heap kept between runs, not mapped and unmapped each time (half the run time was the
// kernel's, faulting fresh pages in).
inline Selection crash_program_start(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  const char* env = std::getenv("ADP_CRASH_ALL");
  const std::string mode = argc > 1 ? argv[1] : "";
  parse_shard(argc, argv);
  crash_shard().in_turn = mode == "quick";
  return Selection{mode == "all" || (env && std::string(env) == "1"), mode == "quick"};
}

// What crash_everywhere ran.
struct Coverage {
  uint64_t points = 0, writes = 0;    // write points crashed at, of the workload's
  uint64_t syncs_run = 0, syncs = 0;  // sync points failed, of the workload's
  uint64_t runs = 0;
  uint64_t points_here = 0, syncs_here = 0;  // of those, run by this process (crash_shard())
};

// Runs ops once to count its writes and syncs (checking the clean run), then crashes at each chosen write
// point with at_point(point, the workload's writes) (which returns its runs): every one, or `bounded` (0: all)
// spread over them; then
// fails each chosen sync in turn: every one, or `bounded_syncs` (0: all) spread over them.
inline Coverage crash_everywhere(const std::vector<Op>& ops, const char* name, uint64_t bounded, uint64_t bounded_syncs,
                                 const std::function<uint64_t(uint64_t point, uint64_t writes)>& at_point) {
  Run clean;
  Coverage c;
  c.writes = count_writes(ops, &clean, name, &c.syncs);
  c.points = bounded && c.writes > bounded ? bounded : c.writes;
  for (uint64_t i = 0; i < c.points; i++) {
    if (!crash_shard().deal(i)) continue;
    c.runs += at_point(i * c.writes / c.points, c.writes);
    c.points_here++;
  }
  c.syncs_run = bounded_syncs && c.syncs > bounded_syncs ? bounded_syncs : c.syncs;
  for (uint64_t i = 0; i < c.syncs_run; i++) {
    if (!crash_shard().deal(i)) continue;
    fail_sync_at(ops, i * c.syncs / c.syncs_run);
    c.runs++;
    c.syncs_here++;
  }
  std::printf("crash harness: %s: %" PRIu64 " of %" PRIu64 " write points, %" PRIu64 " of %" PRIu64
              " sync points, %" PRIu64 " runs\n",
              name, c.points, c.writes, c.syncs_run, c.syncs, c.runs);
  shard_line(name, c.points_here, c.points, "write points");
  shard_line(name, c.syncs_here, c.syncs_run, "sync points");
  return c;
}

}  // namespace adp::testing::crash
