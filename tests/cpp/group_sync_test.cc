// SPDX-License-Identifier: Apache-2.0
// GroupSync (src_cpp/util/group_sync.h), the group commit of a card's
// fdatasync: callers share flushes, each caller's flush began after every
// write it completed before calling (one running already if it began after
// them, else the next), a failed flush fails every caller it covered, and
// every later caller a write of which (or of whose mark on) was issued
// (issue(), before its syscall) before the failed flush returned: it may
// have dropped it (session 32); and FaultDevice (src_cpp/testing),
// which syncs through it, still loses at a power cut only writes no
// successful sync covered, and a write applied while a successful sync ran
// unless a later sync covered it (session 33).
// Built and run by tests/util/test_group_sync.py (also under TSan:
// tests/sanitizers/test_sanitizers.py).
#include "util/group_sync.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "testing/fault_device.h"
#include "util/aligned_buffer.h"

using namespace std::chrono_literals;

namespace {

using adp::GroupSync;
using adp::Status;

// Waits up to 10 s for cond; its last value.
template <typename F>
bool eventually(F cond) {
  for (int i = 0; i < 1000 && !cond(); i++) std::this_thread::sleep_for(10ms);
  return cond();
}

// One caller runs flush 1, held until the other callers have all come and
// wait. Late callers that completed a write after flush 1 began are one
// round, and one flush (the 2nd) covers them all; late callers with no write
// since it began share flush 1 itself. With `fail` the flush of that number
// fails: its own callers see it, and so do the late callers answered by
// flush 2 after a failed flush 1: they issued their writes while flush 1 ran,
// and a flush that fails may drop every write the device took before it
// returned (session 32; until then they were answered OK, the model being
// that only the writes completed when the failed flush began are lost).
void late_callers_share_one_flush(bool wrote_meanwhile, uint64_t fail) {
  constexpr int kLate = 7;
  GroupSync gs;
  std::atomic<uint64_t> events{0}, begin[16] = {};
  std::atomic<bool> first_began{false};
  auto flush = [&]() -> Status {
    const uint64_t n = gs.flushes();  // this flush's number: flushes run one at a time
    begin[n < 16 ? n : 15] = ++events;
    if (n == 1) {
      first_began = true;
      CHECK(eventually([&] { return gs.waiting() == kLate; }), "only %d of %d late callers wait", gs.waiting(), kLate);
    }
    return n == fail ? Status::IoError("flush " + std::to_string(n)) : Status::Ok();
  };
  struct Call {
    uint64_t wrote = 0, number = 0;  // the event of its last write (0: none), the flush that answered
    Status status;
  };
  std::vector<Call> calls(kLate + 1);
  auto call = [&](int i) {
    const uint64_t since = gs.mark();  // before its write: a failed flush 1 may lose the late callers' writes too
    if (i == 0 || wrote_meanwhile) {
      gs.issue();
      calls[i].wrote = ++events;
      gs.wrote();
    }
    calls[i].status = gs.sync(flush, since, &calls[i].number);
  };
  std::vector<std::thread> threads;
  threads.emplace_back(call, 0);
  CHECK(eventually([&] { return first_began.load(); }), "flush 1 did not begin");
  for (int i = 1; i <= kLate; i++) threads.emplace_back(call, i);
  for (auto& t : threads) t.join();
  const uint64_t rounds = wrote_meanwhile ? 2 : 1;
  CHECK(gs.flushes() == rounds, "wrote_meanwhile=%d fail=%llu: %llu flushes for 1 + %d callers, not %llu",
        wrote_meanwhile, static_cast<unsigned long long>(fail), static_cast<unsigned long long>(gs.flushes()), kLate,
        static_cast<unsigned long long>(rounds));
  for (int i = 0; i <= kLate; i++) {
    const Call& c = calls[i];
    const uint64_t want = i == 0 ? 1 : rounds;
    CHECK(c.number == want, "caller %d was answered by flush %llu, not %llu", i,
          static_cast<unsigned long long>(c.number), static_cast<unsigned long long>(want));
    const uint64_t began = begin[c.number < 16 ? c.number : 15];
    CHECK(began > c.wrote, "caller %d: its flush began (event %llu) before its write completed (event %llu)", i,
          static_cast<unsigned long long>(began), static_cast<unsigned long long>(c.wrote));
    // A late caller answered by flush 2 issued its write while flush 1 ran: a failed flush 1 fails it too.
    const bool failed = want == fail || (fail == 1 && i > 0 && wrote_meanwhile);
    CHECK(c.status.ok() == !failed, "caller %d, flush %llu (failing: %llu): %s", i,
          static_cast<unsigned long long>(want), static_cast<unsigned long long>(fail),
          c.status.ok() ? "OK" : c.status.message().c_str());
    if (failed && want != fail)
      CHECK(c.status.message().find("may be lost") != std::string::npos, "caller %d: not the lost answer: %s", i,
            c.status.message().c_str());
  }
  // A caller after the rounds (after a failed flush too) runs its own, and
  // gets its own flush's result.
  const uint64_t since = gs.mark();
  gs.issue();
  gs.wrote();
  CHECK(gs.sync(flush, since).ok() == (rounds + 1 != fail), "the sync after the rounds: not its own flush's result");
  CHECK(gs.flushes() == rounds + 1, "the sync after the rounds did not run a flush of its own");
}

// A failed flush may lose for good every write issued before it returned (a
// failed cache flush, dirty pages the kernel dropped). Caller A completed a
// write, then flush 1 began (it will fail); another write completed, and A
// called sync only then (a store waiting for the stores in front of it): A is
// not covered by flush 1 and waits for flush 2, which succeeds. A must be
// failed all the same (its write may be lost), as must C, whose own write came
// after flush 1 began but whose mark is before A's write (a store behind A's
// record in its region: it depends on that write). B, whose mark was noted
// after flush 1 began, but whose write was issued while it ran, is failed too
// (session 32: until then B was answered OK, the model being that only the
// writes completed when flush 1 began may be lost; fdatasync sends the
// device's cache FLUSH later, and B's write sits in that cache). D, whose
// mark was noted after flush 1 began and whose write was issued after it
// returned, is answered by flush 2 normally.
void failed_flush_fails_later_callers_it_may_have_lost() {
  GroupSync gs("/cards/test.img");
  std::atomic<bool> first_began{false};
  auto flush = [&]() -> Status {
    const uint64_t n = gs.flushes();
    if (n == 1) {
      first_began = true;
      CHECK(eventually([&] { return gs.waiting() == 3; }), "only %d of 3 later callers wait", gs.waiting());
      return Status::IoError("flush 1");
    }
    return Status::Ok();
  };
  const uint64_t mark_a = gs.mark();  // also C's: its record is behind A's
  gs.issue();                         // A's write
  gs.wrote();
  Status leader;
  std::thread l([&] { leader = gs.sync(flush, gs.mark()); });  // runs flush 1 (covers A's write)
  CHECK(eventually([&] { return first_began.load(); }), "flush 1 did not begin");
  const uint64_t mark_b = gs.mark();
  gs.issue();  // B's write (C's is the same for this count), while flush 1 runs
  gs.wrote();
  // D notes its mark while flush 1 runs; its write is issued once flush 1 has returned (its leader, l, woken:
  // no caller is waiting any more but flush 2's).
  const uint64_t mark_d = gs.mark();
  Status a, b, c, d;
  uint64_t na = 0, nb = 0, nc = 0, nd = 0;
  std::thread ta([&] { a = gs.sync(flush, mark_a, &na); });
  std::thread tb([&] { b = gs.sync(flush, mark_b, &nb); });
  std::thread tc([&] { c = gs.sync(flush, mark_a, &nc); });
  l.join();
  gs.issue();  // D's write, after the failed flush 1 returned
  gs.wrote();
  std::thread td([&] { d = gs.sync(flush, mark_d, &nd); });
  for (std::thread* t : {&ta, &tb, &tc, &td}) t->join();
  CHECK(!leader.ok(), "flush 1's own caller was answered OK");
  CHECK(na == 2 && nb == 2 && nc == 2, "the later callers were answered by flushes %llu %llu %llu, not 2",
        static_cast<unsigned long long>(na), static_cast<unsigned long long>(nb), static_cast<unsigned long long>(nc));
  CHECK(!a.ok(), "A, whose write completed before the failed flush 1 began, was answered OK by flush 2");
  CHECK(!c.ok(), "C, whose mark is before A's write (lost with it), was answered OK by flush 2");
  // The answer names the device (CardDevice passes its path): flush 2 succeeded, so no flush's own message does.
  const std::string lost_answer =
      "an earlier sync of /cards/test.img failed after this caller's writes began: they may be lost";
  CHECK(a.message() == lost_answer, "A's answer does not name the device: %s", a.message().c_str());
  CHECK(!b.ok(), "B, whose write was issued while the failed flush 1 ran (before it returned), was answered OK");
  CHECK(d.ok(), "D, whose write was issued after the failed flush 1 returned, was failed: %s", d.message().c_str());
  CHECK(gs.lost_after(mark_a) && gs.lost_after(mark_b) && !gs.lost_after(mark_d),
        "lost_after: not the writes issued when the failed flush returned");
  // Later callers from A's mark still fail (a successful flush since does not bring the write back).
  gs.issue();
  gs.wrote();
  CHECK(!gs.sync(flush, mark_a).ok(), "a caller from A's mark was answered OK after a later successful flush");
  CHECK(gs.sync(flush, gs.mark()).ok(), "a caller with a fresh mark was failed");
}

// A write issued before a flush that fails began, but counted as completed
// only after it returned (its thread between the syscall and wrote():
// preempted there), was on the device when the failed flush lost the
// device's cache: its caller is failed, though the failed flush did not
// cover it and the flush that answers it succeeds. Until session 32 the
// failed flush kept only its covers (completed writes): answered OK.
void write_counted_after_a_failed_flush_is_failed() {
  GroupSync gs;
  int n = 0;
  auto flush = [&]() -> Status { return ++n == 1 ? Status::IoError("flush 1") : Status::Ok(); };
  const uint64_t mark = gs.mark();
  gs.issue();  // the write's syscall: on the device, not counted yet
  CHECK(!gs.sync(flush, gs.mark()).ok(), "flush 1 did not fail");
  gs.wrote();  // counted now, after flush 1 failed
  const Status s = gs.sync(flush, mark);
  CHECK(n == 2, "the caller was not answered by a flush of its own (%d flushes)", n);
  CHECK(!s.ok(), "a write issued before the failed flush 1, counted after it, was answered OK by flush 2");
  CHECK(gs.lost_after(mark) && !gs.lost_after(gs.mark()), "lost_after: not the writes issued when flush 1 returned");
}

// Many callers, every third flush failing. Each caller completes a write,
// then syncs. A flush takes a snapshot of the completed writes when it
// begins and, when it succeeds, makes them durable (as fdatasync). A caller
// answered OK finds its write durable; one answered with an error was
// covered by a failed flush that began after its call.
void callers_covered_by_their_flush() {
  constexpr int kThreads = 8, kCalls = 300;
  GroupSync gs;
  std::atomic<uint64_t> events{0};
  std::vector<std::atomic<uint64_t>> begin(kThreads * kCalls + 2);
  std::vector<std::atomic<uint64_t>> completed(kThreads);
  std::vector<uint64_t> durable(kThreads, 0);
  std::mutex durable_mu;
  std::atomic<int> in_flush{0}, overlaps{0};
  auto flush = [&]() -> Status {
    if (in_flush++) overlaps++;
    const uint64_t n = gs.flushes();
    begin[n] = ++events;
    std::vector<uint64_t> snap(kThreads);
    for (int t = 0; t < kThreads; t++) snap[t] = completed[t];
    std::this_thread::sleep_for(100us);
    Status s = Status::IoError("flush " + std::to_string(n));
    if (n % 3 != 0) {
      std::lock_guard<std::mutex> l(durable_mu);
      for (int t = 0; t < kThreads; t++) durable[t] = std::max(durable[t], snap[t]);
      s = Status::Ok();
    }
    in_flush--;
    return s;
  };
  std::atomic<int> bad_order{0}, lost{0}, wrong_status{0}, failed{0}, lost_failed{0};
  auto worker = [&](int t) {
    for (int i = 1; i <= kCalls; i++) {
      const uint64_t since = gs.mark();
      gs.issue();
      completed[t] = i;  // a write completes
      const uint64_t wrote = ++events;
      gs.wrote();
      uint64_t number = 0;
      const Status s = gs.sync(flush, since, &number);
      if (begin[number] <= wrote) bad_order++;
      if (s.ok()) {
        std::lock_guard<std::mutex> l(durable_mu);
        if (number % 3 == 0) wrong_status++;
        if (durable[t] < static_cast<uint64_t>(i)) lost++;
      } else if (number % 3 != 0) {  // a failed flush began after its write began: it may have lost it
        lost_failed++;
        if (s.message().find("may be lost") == std::string::npos) wrong_status++;
      } else {
        failed++;
        if (s.message() != "flush " + std::to_string(number)) wrong_status++;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  const uint64_t flushes = gs.flushes();
  std::printf("callers_covered_by_their_flush: %d calls, %llu flushes, %d failed, %d failed by an earlier one\n",
              kThreads * kCalls, static_cast<unsigned long long>(flushes), failed.load(), lost_failed.load());
  CHECK(overlaps == 0, "%d flushes ran while another ran", overlaps.load());
  CHECK(bad_order == 0, "%d callers answered by a flush that began before their write completed", bad_order.load());
  CHECK(lost == 0, "%d callers answered OK whose write no successful flush covered", lost.load());
  CHECK(wrong_status == 0, "%d callers given another flush's result", wrong_status.load());
  CHECK(failed > 0, "no caller saw a failed flush");
  CHECK(flushes < static_cast<uint64_t>(kThreads * kCalls), "%llu flushes for %d calls: none shared",
        static_cast<unsigned long long>(flushes), kThreads * kCalls);
}

// FaultDevice syncs through GroupSync: threads that write and sync at once
// share syncs, and after a power cut every write a sync acknowledged holds
// its bytes (the unsynced ones are undone).
void fault_device_keeps_acknowledged_writes() {
  constexpr int kThreads = 4, kWrites = 200;
  constexpr size_t kBlock = 4096;
  auto image = std::make_shared<adp::testing::FaultImage>(kThreads * kWrites * kBlock);
  adp::testing::FaultDevice dev(image);
  std::vector<std::vector<bool>> acked(kThreads, std::vector<bool>(kWrites));
  auto worker = [&](int t) {
    adp::AlignedBuffer buf;
    CHECK(buf.reserve(kBlock), "no memory");
    for (int i = 0; i < kWrites; i++) {
      std::memset(buf.data(), 1 + (t * kWrites + i) % 255, kBlock);
      const uint64_t since = dev.write_mark();
      if (!dev.write(uint64_t(t * kWrites + i) * kBlock, buf.data(), kBlock).ok()) continue;
      acked[t][i] = dev.sync(since).ok();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  const uint64_t syncs = dev.syncs();
  dev.power_cut();
  int missing = 0, not_acked = 0;
  for (int t = 0; t < kThreads; t++)
    for (int i = 0; i < kWrites; i++) {
      if (!acked[t][i]) {
        not_acked++;
        continue;
      }
      const uint8_t want = 1 + (t * kWrites + i) % 255;
      const uint8_t* p = image->data.data() + uint64_t(t * kWrites + i) * kBlock;
      for (size_t b = 0; b < kBlock; b++)
        if (p[b] != want) {
          missing++;
          break;
        }
    }
  std::printf("fault_device_keeps_acknowledged_writes: %d syncs called, %llu run\n", kThreads * kWrites,
              static_cast<unsigned long long>(syncs));
  CHECK(not_acked == 0, "%d syncs failed on a healthy device", not_acked);
  CHECK(missing == 0, "%d acknowledged writes lost at the power cut", missing);
  CHECK(syncs <= static_cast<uint64_t>(kThreads * kWrites), "more syncs run than called");
}

// A failed sync of FaultDevice fails every caller it covered: its writes
// stay unsynced (a power cut undoes them) until a later sync succeeds.
void fault_device_failed_sync() {
  constexpr size_t kBlock = 4096;
  auto image = std::make_shared<adp::testing::FaultImage>(4 * kBlock);
  adp::testing::FaultDevice dev(image);
  adp::AlignedBuffer buf;
  CHECK(buf.reserve(kBlock), "no memory");
  std::memset(buf.data(), 7, kBlock);
  CHECK(dev.write(0, buf.data(), kBlock).ok(), "write failed");
  dev.fail_sync(dev.syncs());
  CHECK(!dev.sync(0).ok(), "the injected sync failure was not returned");
  dev.power_cut();
  CHECK(image->data[0] == 0, "a write covered only by a failed sync survived the power cut");
}

using HeldFlush = adp::testing::HeldFlushDevice;

// A FaultDevice sync that succeeds makes durable the writes applied before it began, not one applied while it ran
// (review32b F5, session 33): fdatasync need not write back a page dirtied after it began. That write is undone by a
// power cut unless a later sync succeeded. Until then the sync made every write applied when it took the device's
// lock durable: with `later_sync` false, "a write applied while a sync ran survived the power cut".
void fault_device_sync_makes_durable_only_writes_before_it(bool later_sync) {
  constexpr size_t kBlock = 4096;
  auto image = std::make_shared<adp::testing::FaultImage>(4 * kBlock);
  HeldFlush dev(image);
  dev.hold_next();  // its first flush waits, once begun, until released
  adp::AlignedBuffer buf;
  CHECK(buf.reserve(kBlock), "no memory");
  std::memset(buf.data(), 7, kBlock);
  CHECK(dev.write(0, buf.data(), kBlock).ok(), "write failed");
  Status synced;
  std::thread syncer([&] { synced = dev.sync(0); });
  dev.wait_held();  // the sync began: block 0 was applied before it
  std::memset(buf.data(), 9, kBlock);
  CHECK(dev.write(kBlock, buf.data(), kBlock).ok(), "write failed");  // applied while it runs
  dev.release();
  syncer.join();
  CHECK(synced.ok(), "the sync failed: %s", synced.message().c_str());
  if (later_sync) CHECK(dev.sync(dev.write_mark()).ok(), "the later sync failed");
  dev.power_cut();
  CHECK(image->data[0] == 7, "a write applied before a successful sync began did not survive the power cut");
  if (later_sync)
    CHECK(image->data[kBlock] == 9, "a write a later sync made durable did not survive the power cut");
  else
    CHECK(image->data[kBlock] == 0, "a write applied while a sync ran survived the power cut (no later sync)");
  std::printf("fault_device_sync_makes_durable_only_writes_before_it(%s): ok\n",
              later_sync ? "a later sync" : "no later sync");
}

}  // namespace

int main() {
  for (bool wrote_meanwhile : {true, false})
    for (uint64_t fail : {0, 1, 2}) late_callers_share_one_flush(wrote_meanwhile, fail);
  failed_flush_fails_later_callers_it_may_have_lost();
  write_counted_after_a_failed_flush_is_failed();
  callers_covered_by_their_flush();
  fault_device_keeps_acknowledged_writes();
  fault_device_failed_sync();
  for (bool later_sync : {false, true}) fault_device_sync_makes_durable_only_writes_before_it(later_sync);
  return adp::testing::finish("group_sync_test");
}
