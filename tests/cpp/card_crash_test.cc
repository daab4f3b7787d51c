// SPDX-License-Identifier: Apache-2.0
// Crash consistency of the card store on a fault-injecting device
// (src_cpp/testing/fault_device.h). Built and run by
// tests/store/test_crash_consistency.py. The workload, faults and checks are
// tests/cpp/crash_harness.h's (card_crash_aligned_test.cc runs them on values
// in 4 KiB-aligned memory); the values here are not aligned (staged).
//
//   card_crash_test [all]
//
// A scripted workload (stores, supersedes, deletes, loads, evictions; three
// writers, each with its own IoContext and open region) runs once to count
// its writes. Then, for each chosen write point:
//   - power cut at that write (whole, or torn after its first 4 KiB block;
//     a single 4 KiB block is written atomically, as on a 4Kn device): every
//     unsynced write is lost, the card is reopened;
//   - power cut at that write keeping a seeded subset of the unsynced writes
//     before it (a disk's cache reorders them: each lands whole or not);
//   - a process crash at that write: it never lands, every write before it
//     stays, synced or not, in the order written (no held object may be lost
//     then, not even to a newer store of its key that was not acknowledged);
//   - that write fails (an I/O error), the workload goes on, then a power cut
//     at the end and a reopen.
// After each reopen:
//   - every key is absent, or holds byte-exact the value of its last
//     acknowledged store, or of a store attempted after it that was never
//     acknowledged: no deleted key and no superseded copy comes back, nothing
//     torn is served;
//   - every object the store held (indexed) when the power went is back;
//   - stats: objects and used_bytes match what is found; no damage is
//     counted (recovery_damaged_regions 0: a crash only cuts writes).
// Default: a bounded number of cut points spread over the workload; with
// `all` (or ADP_CRASH_ALL=1) every write point. A second, shorter workload
// of objects that continue into the next region (format 3: one write
// frontier, records spanning regions, eviction of a region a record
// continues into) is cut at every one of its write points: a cut between
// the two halves of a spanning object, or before the next region's header.
// Every sync point of both workloads is failed in turn (a store whose
// sync failed must not outlive a later delete of its key). And two writers
// at once: a store reserved behind one whose write is stuck is not
// acknowledged before the hole is written or marked. A region header lost in
// a cut that kept records written under its epoch (two cuts: the epoch must
// not be handed out again, or the leftovers come back as valid records and
// a deleted key with them). Also checked: an unreadable object header
// block costs its own object, not the card; an unreadable superblock
// opens with its backup, and both unreadable are refused with what to run.
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "check.h"
#include "crash_harness.h"
#include "store/card_store.h"
#include "store/key_index.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using namespace adp::testing::crash;  // NOLINT: the harness's workload, checks and crashes
using adp::testing::check_failures;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;
using adp::testing::put_one;
using adp::testing::read_object;

constexpr int kOps = 160;

std::vector<Op> make_script() {
  std::mt19937 g(12345);
  std::vector<Op> ops;
  for (int i = 0; i < kOps; i++) {
    Op op;
    int r = g() % 10;
    op.kind = r < 6 ? Op::kPut : r < 8 ? Op::kDelete : Op::kGet;
    op.writer = g() % kWriters;
    int n = op.kind == Op::kPut ? 1 + g() % 3 : 1;
    for (int j = 0; j < n; j++) {
      op.keys.push_back(g() % kKeys);
      op.sizes.push_back(8 + g() % (300 << 10));  // 8 B .. 300 KiB: the 10 regions fill and evict
    }
    ops.push_back(op);
  }
  return ops;
}

// Objects of 400-900 KiB in 1 MiB regions: most continue into the next
// region, some into two; the 10 regions fill and evict.
std::vector<Op> make_span_script() {
  std::mt19937 g(777);
  std::vector<Op> ops;
  for (int i = 0; i < 40; i++) {
    Op op;
    int r = g() % 10;
    op.kind = r < 7 ? Op::kPut : r < 9 ? Op::kDelete : Op::kGet;
    op.writer = g() % kWriters;
    op.keys.push_back(g() % 16);
    op.sizes.push_back(r == 0 ? 1500 << 10 : (400 << 10) + g() % (500 << 10));
    ops.push_back(op);
  }
  return ops;
}

// The region header written when the frontier opens a region is synced
// before any record is written under its epoch. Without that sync a power
// cut may keep records written under the new epoch and lose the header that
// carries it: recovery then hands the epoch out again, and the leftovers
// walk as valid records of the region reopened under it, outranking what
// happened in between. The scenario: objects of 200 KiB (footprint 204 KiB,
// five fill a 1 MiB region exactly, so records sit at the same offsets in
// every epoch): 20 stored (regions 0-3), then one batch re-storing four of
// them, which opens region 4; the power goes at one of the batch's writes,
// keeping a seeded subset of the unsynced writes. Reopen: delete every key
// (acknowledged), store a fresh key (it opens the next region; with a
// reused epoch, region 4 again, over the batch's first slot), power cut,
// reopen: no deleted key may be back. Every seed and cut point of the batch.
void lost_region_header_reused_epoch() {
  constexpr size_t kSize = 200 << 10;
  constexpr int kStored = 20, kBatch = 4;
  auto key = [](int k) { return "epoch-" + std::to_string(k); };
  int cases = 0, kept_leftovers = 0;
  for (uint64_t seed = 0; seed < 8; seed++) {
    for (uint64_t cut = 1; cut <= kBatch; cut++) {
      auto image = fresh_image();
      {
        FaultDevice* dev;
        auto s = open_store(image, "open", &dev);
        if (!s) return;
        IoContext ctx;
        for (int k = 0; k < kStored; k++) {
          Status r = put_one(*s, ctx, key(k), value_bytes(k + 1, kSize));
          CHECK(r.ok(), "epoch: store %d: %s", k, r.message().c_str());
        }
        // The batch: region 4's header, then its records (the cut at one of
        // them, after the header).
        std::vector<std::vector<uint8_t>> bufs;
        std::vector<std::string> names;
        std::vector<adp::PutItem> items;
        for (int j = 0; j < kBatch; j++) {
          bufs.push_back(value_bytes(100 + j, kSize));
          names.push_back(key(j));
        }
        for (int j = 0; j < kBatch; j++) items.push_back({names[j], bufs[j].data(), bufs[j].size()});
        std::vector<Status> results(kBatch);
        dev->keep_unsynced_at_cut(seed);
        dev->cut_power_at_write(dev->writes() + cut);
        s->put(ctx, items.data(), items.size(), results.data(), [] { return true; });
        for (const Status& r : results) CHECK(!r.ok(), "epoch: a store of the cut batch was acknowledged");
        kept_leftovers += dev->kept_at_cut() > 0;
      }
      std::string fresh = "epoch-fresh";
      {
        FaultDevice* dev;
        auto s = open_store(image, "epoch: reopen", &dev);
        if (!s) return;
        IoContext ctx;
        for (int k = 0; k < kStored; k++) {
          Status r = s->remove(ctx, key(k));
          CHECK(r.ok(), "epoch seed %" PRIu64 " cut %" PRIu64 ": delete of %s: %s", seed, cut, key(k).c_str(),
                r.message().c_str());
        }
        Status r = put_one(*s, ctx, fresh, value_bytes(999, kSize));
        CHECK(r.ok(), "epoch: fresh store: %s", r.message().c_str());
        dev->power_cut();  // the second cut: all of it was acknowledged, so synced
      }
      auto s = open_store(image, "epoch: second reopen");
      if (!s) return;
      IoContext ctx;
      for (int k = 0; k < kStored; k++) {
        auto got = read_object(*s, ctx, key(k));
        uint64_t v = 0;
        if (got && got->size() >= 8) std::memcpy(&v, got->data(), 8);
        CHECK(!got, "epoch seed %" PRIu64 " cut %" PRIu64 ": %s was deleted and is back (value %" PRIu64 ")", seed, cut,
              key(k).c_str(), v);
      }
      CHECK(read_object(*s, ctx, fresh) == value_bytes(999, kSize), "epoch: the fresh store is lost");
      CHECK(s->stats().recovery_damaged_regions == 0, "epoch seed %" PRIu64 " cut %" PRIu64 ": damage counted", seed,
            cut);
      cases++;
    }
  }
  std::printf("card_crash_test: lost region header: %d cases (seeds x cut points), %d kept unsynced writes\n", cases,
              kept_leftovers);
}

// A store whose caller gave up (or whose sync failed) is never indexed and
// is voided on the card after its bytes were written. Until that void is
// durable its copy, with a seq above the indexed one's, could come back at a
// power cut and outrank a delete's tombstone: a delete of the key is refused
// meanwhile (and while the store is in flight at all). Two cases: the void's
// write held, then a cut; the store's own write held, then let go, and the
// delete retried once the store is settled.
void delete_while_store_unsettled() {
  for (int held_write = 1; held_write >= 0; held_write--) {
    auto image = fresh_image();
    FaultDevice* dev;
    auto s = open_store(image, "open", &dev);
    if (!s) return;
    IoContext c0, cp, cd;
    auto v0 = value_bytes(1, 20000), v1 = value_bytes(2, 20000);
    Status r0 = put_one(*s, c0, "void-k", v0), r1;
    CHECK(r0.ok(), "void: first store: %s", r0.message().c_str());
    // held_write 0: the store's record write; 1: its void's tombstone write
    // (after the record and the sync).
    dev->hold_write(dev->writes() + held_write);
    std::thread p([&] { r1 = put_one(*s, cp, "void-k", v1, /*wanted=*/false); });  // its caller gives up
    while (!dev->write_held()) std::this_thread::yield();
    Status d = s->remove(cd, "void-k");
    CHECK(!d.ok(), "void case %d: a delete was acknowledged while a store of the key was %s", held_write,
          held_write ? "being voided" : "in flight");
    if (held_write) {
      dev->power_cut();  // the void never lands
      p.join();
    } else {
      dev->release_held_write(false);
      p.join();
      d = s->remove(cd, "void-k");  // settled now: the delete goes through
      CHECK(d.ok(), "void case 0: the delete after the store settled: %s", d.message().c_str());
      dev->power_cut();
    }
    CHECK(!r1.ok(), "void case %d: the store whose caller gave up was acknowledged", held_write);
    s.reset();
    auto re = open_store(image, "void: reopen");
    if (!re) return;
    IoContext ctx;
    auto got = read_object(*re, ctx, "void-k");
    CHECK(!d.ok() || !got, "void case %d: the key was deleted (acknowledged) and is back after a power cut",
          held_write);
    CHECK(!got || *got == v0 || *got == v1, "void case %d: the key serves other bytes", held_write);
  }
  std::printf("card_crash_test: delete while a store of the key is unsettled: refused, then done and kept\n");
}

void unreadable_block() {
  auto image = fresh_image();
  std::vector<std::string> keys;
  {
    auto s = open_store(image, "open");
    if (!s) return;
    IoContext ctx;
    for (int i = 0; i < 24; i++) {  // 24 x 100 KiB: three regions
      keys.push_back("damage-" + std::to_string(i));
      Status r = put_one(*s, ctx, keys.back(), value_bytes(i + 1, 100 << 10));
      CHECK(r.ok(), "store: %s", r.message().c_str());
    }
  }
  // The second object's header block in region 0 cannot be read any more.
  auto dev = std::make_unique<FaultDevice>(image, "damaged-card");
  uint64_t region0 = adp::kDataOffset;
  uint64_t second = region0 + adp::kBlockSize + adp::object_footprint(100 << 10);
  dev->fail_reads(second, second + adp::kBlockSize);
  CardOptions co;
  co.durable = true;
  std::unique_ptr<CardStore> s;
  Status st = CardStore::OpenDevice(std::move(dev), co, &s);
  CHECK(st.ok(), "a card with one unreadable block must open: %s", st.message().c_str());
  if (!st.ok()) return;
  adp::StoreStats stats = s->stats();
  CHECK(stats.media_errors == 1, "media_errors %" PRIu64 ", expected 1", stats.media_errors);
  CHECK(stats.recovery_damaged_regions == 0, "an unreadable block is a media error, not damage read back");
  IoContext ctx;
  int served = 0;
  for (size_t i = 0; i < keys.size(); i++) {
    auto got = read_object(*s, ctx, keys[i]);
    if (got) {
      served++;
      CHECK(*got == value_bytes(i + 1, 100 << 10), "damaged card: %s served wrong bytes", keys[i].c_str());
    }
  }
  // The second object's header is the damage: it costs that object only (since session 33; until then the walk
  // ended there and the 8 objects behind it in region 0 were lost too).
  CHECK(served == static_cast<int>(keys.size()) - 1, "damaged card served %d of %zu objects", served, keys.size());
  CHECK(read_object(*s, ctx, keys[0]).has_value(), "the object before the damage is lost");
  std::printf("card_crash_test: unreadable block: card opened, %d of %zu objects served, media_errors=%" PRIu64 "\n",
              served, keys.size(), stats.media_errors);
}

// One write frontier, several writers: a store whose write is stuck leaves
// a hole in the region; a store reserved after it must not be acknowledged
// before the hole is written or marked, since recovery's walk of the region
// stops at the hole. Writer A's object write blocks; writer B stores behind
// it; the power goes (A's write never lands). B, if acknowledged, must be
// back after the reopen.
void hole_before_acknowledged_store() {
  auto image = fresh_image();
  FaultDevice* dev;
  auto s = open_store(image, "open", &dev);
  if (!s) return;
  IoContext warm, ca, cb;
  auto w = value_bytes(1, 8192), a = value_bytes(2, 20000), b = value_bytes(3, 20000);
  Status wr = put_one(*s, warm, "hole-warm", w), ar, br;  // opens the frontier region
  CHECK(wr.ok(), "warm-up store: %s", wr.message().c_str());
  dev->hold_write(dev->writes());  // A's object write
  std::thread ta([&] { ar = put_one(*s, ca, "hole-a", a); });
  while (!dev->write_held()) std::this_thread::yield();
  std::atomic<bool> b_done{false};
  std::thread tb([&] {
    br = put_one(*s, cb, "hole-b", b);
    b_done = true;
  });
  // B is acknowledged quickly unless it waits for A (as it must); the wait
  // only bounds how long the test gives a wrong acknowledgement to happen.
  for (int i = 0; i < 100 && !b_done; i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  dev->power_cut();
  ta.join();
  tb.join();
  CHECK(!ar.ok(), "a store whose write never landed was acknowledged");
  s.reset();
  auto re = open_store(image, "reopen");
  if (!re) return;
  IoContext ctx;
  CHECK(read_object(*re, ctx, "hole-warm") == w, "hole: the store before the hole is lost");
  bool b_back = read_object(*re, ctx, "hole-b") == b;
  CHECK(!br.ok() || b_back, "hole: store B was acknowledged behind a hole and is lost");
  std::printf("card_crash_test: hole before a store: B %s\n", !br.ok() ? "not acknowledged (waited for the hole)"
                                                              : b_back ? "acknowledged and back"
                                                                       : "acknowledged, LOST");
}

void unreadable_superblock() {
  auto image = fresh_image();
  if (!open_store(image, "open")) return;
  // Block 0 unreadable, the backup superblock (session 39) readable: the card opens with the backup.
  auto dev = std::make_unique<FaultDevice>(image, "bad-superblock-card");
  dev->fail_reads(0, adp::kBlockSize);
  std::unique_ptr<CardStore> s;
  Status st = CardStore::OpenDevice(std::move(dev), CardOptions{}, &s);
  CHECK(st.ok() && s->stats().superblock_block_zero_bad == 1, "unreadable block 0, the backup readable: %s",
        st.message().c_str());
  s.reset();
  // Both copies unreadable: refused, with what to run.
  dev = std::make_unique<FaultDevice>(image, "bad-superblock-card");
  dev->fail_reads(0, adp::kBlockSize);
  dev->fail_reads(adp::kBackupSuperblockOffset, adp::kDataOffset);
  st = CardStore::OpenDevice(std::move(dev), CardOptions{}, &s);
  CHECK(!st.ok() && st.message().find("lmcache-adp format --card bad-superblock-card --yes") != std::string::npos,
        "unreadable superblock and backup: %s", st.message().c_str());
}

// KeyIndex against std::unordered_map: random inserts, replaces and erases
// over a key space small enough for long probe runs and wrap-around (the
// hashes are drawn so that many share a home slot).
void key_index_model() {
  adp::KeyIndex idx;
  std::unordered_map<uint64_t, uint64_t> model;  // hash -> seq
  std::mt19937_64 g(99);
  for (int i = 0; i < 300000; i++) {
    uint64_t h = (g() % 5000) * 0x100000001ull;  // clustered: few distinct high bits
    int op = g() % 3;
    if (op < 2) {
      uint64_t seq = g() & adp::kMaxIndexSeq;
      auto [it, inserted] = idx.try_emplace(h, adp::IndexEntry(7, 3, 100, seq));
      if (!inserted) it->second.seq = seq;
      model[h] = seq;
    } else {
      bool a = idx.erase(h), b = model.erase(h) > 0;
      CHECK(a == b, "key index: erase of %" PRIu64 " disagrees", h);
    }
    if (i % 1000 == 0 || i == 299999) {
      CHECK(idx.size() == model.size(), "key index: size %zu, model %zu", idx.size(), model.size());
      for (auto [mh, seq] : model) {
        auto it = idx.find(mh);
        CHECK(it && it->second.seq == seq, "key index: %" PRIu64 " lost or wrong", mh);
        if (!it || it->second.seq != seq) return;
      }
      size_t n = 0;
      idx.for_each([&](uint64_t, const adp::IndexEntry&) { n++; });
      CHECK(n == model.size(), "key index: for_each saw %zu of %zu", n, model.size());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("ADP_CRASH_ALL");
  bool all = (argc > 1 && std::string(argv[1]) == "all") || (env && std::string(env) == "1");
  parse_shard(argc, argv);
  const Shard shard = crash_shard();
  if (shard.first()) key_index_model();
  auto ops = make_script();
  Run clean;
  uint64_t syncs = 0;
  uint64_t writes = count_writes(ops, &clean, "mixed", &syncs);
  std::vector<uint64_t> points;
  const uint64_t kBounded = 48;
  if (all || writes <= kBounded) {
    for (uint64_t p = 0; p < writes; p++) points.push_back(p);
  } else {
    for (uint64_t i = 0; i < kBounded; i++) points.push_back(i * writes / kBounded + (i * 7) % 3);
  }
  uint64_t runs = 0, here = 0, chosen = 0;
  for (uint64_t p : points) {
    if (p >= writes) continue;
    if (shard.takes(chosen++)) runs += crashes_at(ops, p), here++;
  }
  shard_line("mixed", here, chosen, "write points");
  // Failed syncs: every sync point of a workload.
  auto fail_every_sync = [&](const std::vector<Op>& script, const char* name, uint64_t n) {
    here = 0;
    for (uint64_t p = 0; p < n; p++) {
      if (!shard.takes(p)) continue;
      fail_sync_at(script, p);
      runs++, here++;
    }
    shard_line(name, here, n, "sync points");
  };
  fail_every_sync(ops, "mixed", syncs);
  // Spanning records: every write point, whole and torn cuts, failed writes; every sync point.
  auto span_ops = make_span_script();
  Run span_clean;
  uint64_t span_syncs = 0;
  uint64_t span_writes = count_writes(span_ops, &span_clean, "spanning", &span_syncs);
  here = 0;
  for (uint64_t p = 0; p < span_writes; p++)
    if (shard.takes(p)) runs += crashes_at(span_ops, p), here++;
  shard_line("spanning", here, span_writes, "write points");
  fail_every_sync(span_ops, "spanning", span_syncs);
  if (shard.first()) {  // the one-off scenarios
    hole_before_acknowledged_store();
    lost_region_header_reused_epoch();
    delete_while_store_unsettled();
    unreadable_block();
    unreadable_superblock();
  }
  std::printf("card_crash_test: %" PRIu64 " of %" PRIu64 " write points (%s), all %" PRIu64 " sync points, all %" PRIu64
              " write points and all %" PRIu64 " sync points of the spanning workload, %" PRIu64
              " runs, %d failures; %" PRIu64 " reopens checked for damage counted (none may be)\n",
              static_cast<uint64_t>(points.size()), writes, all ? "all" : "bounded; ADP_CRASH_ALL=1 for all", syncs,
              span_writes, span_syncs, runs, check_failures, damage_checked);
  return adp::testing::finish("card_crash_test");
}
