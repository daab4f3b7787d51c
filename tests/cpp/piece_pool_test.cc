// SPDX-License-Identifier: Apache-2.0
// PiecePool (src_cpp/util/piece_pool.h), the helpers of the gateway's
// process loads: every piece runs once, on one thread per slot at a time;
// helpers take part where CPUs are spare and never where they are not, nor
// where as many connections load as there are CPUs (helpers_now() says so
// beforehand), nor in a job run alone; a
// failing piece stops its job only; a caller whose helper is stalled in
// another job's piece never waits for it; stop() with pieces in flight; and
// the CRC of pieces checked out of order, joined in order (crc32c_combine).
// Built and run by tests/util/test_piece_pool.py (also under ASan and TSan).
#include "util/piece_pool.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "check.h"
#include "util/crc32c.h"

using namespace std::chrono_literals;

namespace {

using adp::PiecePool;

// Waits up to 10 s for cond; its last value.
template <typename F>
bool eventually(F cond) {
  for (int i = 0; i < 1000 && !cond(); i++) std::this_thread::sleep_for(10ms);
  return cond();
}

// Every piece once, each slot on one thread at a time, helpers taking part.
void every_piece_once() {
  PiecePool pool(4, 2, 64);
  constexpr size_t kPieces = 2000;
  std::vector<std::atomic<int>> runs(kPieces);
  std::atomic<bool> in_slot[3] = {};
  std::atomic<int> overlaps{0}, bad_slot{0};
  for (int rep = 0; rep < 5; rep++) {
    for (auto& r : runs) r = 0;
    bool ok = pool.run(kPieces, [&](size_t i, int slot) {
      if (slot < 0 || slot > 2) {
        bad_slot++;
        return true;
      }
      if (in_slot[slot].exchange(true)) overlaps++;
      runs[i]++;
      std::this_thread::sleep_for(20us);  // long enough for a helper to join
      in_slot[slot] = false;
      return true;
    });
    CHECK(ok, "run() returned false with no failing piece");
    int wrong = 0;
    for (auto& r : runs) wrong += r.load() != 1;
    CHECK(wrong == 0, "%d pieces did not run exactly once", wrong);
  }
  CHECK(overlaps == 0, "a slot was used by two threads at once (%d)", overlaps.load());
  CHECK(bad_slot == 0, "a slot outside [0, max_helpers]");
  CHECK(pool.helped_pieces() > 0, "no helper took a piece (threads 4, CPUs 64)");
}

// Of 20 jobs of 200 pieces (10 us each) run on pool (`alone` as run() takes it), the pieces helpers ran.
int helper_pieces(PiecePool& pool, bool alone = false) {
  std::atomic<int> n{0};
  for (int rep = 0; rep < 20; rep++)
    pool.run(
        200,
        [&](size_t, int slot) {
          std::this_thread::sleep_for(10us);
          n += slot != 0;
          return true;
        },
        alone);
  return n.load();
}

// No CPU spare (one, taken by the caller): the caller runs every piece.
void no_spare_cpu_no_helper() {
  PiecePool pool(4, 2, 1);
  const int n = helper_pieces(pool);
  CHECK(n == 0 && pool.helped_pieces() == 0, "helpers ran %d pieces with no CPU spare", n);
}

// As many callers (connections loading) as CPUs: no helper joins; with
// one caller for the same CPUs, helpers do.
void callers_share_the_cpus() {
  PiecePool pool(4, 2, 4);
  {
    std::vector<std::unique_ptr<PiecePool::Caller>> callers;
    for (int i = 0; i < 4; i++) callers.push_back(std::make_unique<PiecePool::Caller>(&pool));
    const int n = helper_pieces(pool);
    CHECK(n == 0, "helpers ran %d pieces with 4 callers on 4 CPUs", n);
  }
  PiecePool::Caller one(&pool);
  CHECK(helper_pieces(pool) > 0, "no helper joined one caller on 4 CPUs");
}

// helpers_now() before a job: true while callers leave one a helper, false
// with as many callers as CPUs, with no helper threads, and after stop(). A
// job run alone takes none where helpers join the same job run shared.
void helpers_now_and_alone() {
  PiecePool pool(4, 2, 4);
  CHECK(pool.helpers_now(), "no helper for one caller on 4 CPUs");
  {
    std::vector<std::unique_ptr<PiecePool::Caller>> callers;
    for (int i = 0; i < 2; i++) callers.push_back(std::make_unique<PiecePool::Caller>(&pool));
    CHECK(pool.helpers_now(), "no helper for 2 callers on 4 CPUs");
    for (int i = 0; i < 2; i++) callers.push_back(std::make_unique<PiecePool::Caller>(&pool));
    CHECK(!pool.helpers_now(), "a helper for 4 callers on 4 CPUs");
  }
  PiecePool none(0, 2, 4);
  CHECK(!none.helpers_now(), "a helper in a pool of no threads");
  const uint64_t helped = pool.helped_pieces();
  CHECK(helper_pieces(pool, true) == 0 && pool.helped_pieces() == helped, "helpers joined jobs run alone");
  CHECK(helper_pieces(pool) > 0, "no helper joined the same jobs run shared");
  pool.stop();
  CHECK(!pool.helpers_now(), "a helper after stop()");
}

// A piece that fails: run() says so, the pieces not yet started never start
// (not even after run() returned), and the pool serves the next job whole.
void failing_piece_stops_its_job() {
  PiecePool pool(2, 2, 64);
  std::atomic<int> started{0};
  bool ok = pool.run(1000, [&](size_t i, int) {
    started++;
    std::this_thread::sleep_for(20us);
    return i != 10;
  });
  const int at_return = started;
  std::this_thread::sleep_for(20ms);
  CHECK(!ok, "run() returned true after a piece failed");
  CHECK(at_return < 1000, "every piece ran after one failed");
  CHECK(started == at_return, "%d pieces started after run() returned", started.load() - at_return);
  std::atomic<int> n{0};
  CHECK(pool.run(100,
                 [&](size_t, int) {
                   n++;
                   return true;
                 }) &&
            n == 100,
        "the next job did not run whole (%d)", n.load());
}

// A helper stalled in job A's piece (a client that never serves its memory)
// holds back A only: job B, on another thread, finishes while A's helper is
// still stalled, its caller running every piece itself.
void stalled_helper_holds_back_its_job_only() {
  PiecePool pool(1, 1, 64);
  std::atomic<bool> release{false}, helper_in{false}, a_done{false}, b_done{false};
  std::thread a([&] {
    pool.run(4, [&](size_t, int slot) {
      if (slot != 0) {
        helper_in = true;
        while (!release) std::this_thread::sleep_for(1ms);
      } else {
        while (!helper_in && !release) std::this_thread::sleep_for(1ms);  // hold the pieces until the helper joins
      }
      return true;
    });
    a_done = true;
  });
  CHECK(eventually([&] { return helper_in.load(); }), "the helper never joined job A");
  std::thread b([&] {
    std::atomic<int> n{0};
    pool.run(50, [&](size_t, int) {
      n++;
      return true;
    });
    b_done = n == 50;
  });
  CHECK(eventually([&] { return b_done.load(); }), "job B waited on job A's stalled helper");
  CHECK(!a_done, "job A returned while its helper was still in a piece");
  release = true;
  a.join();
  b.join();
  CHECK(a_done, "job A did not finish");
}

// stop() while a job's pieces are in flight on helpers: they finish, the
// helpers leave, the caller runs the rest; every piece once. stop() returns
// only after the helpers' pieces have: a helper's piece begun before stop()
// waits for it to be called, then goes on 50 ms, so a stop() that returned
// without waiting for it would find a helper still in its piece.
void stop_with_pieces_in_flight() {
  auto pool = std::make_unique<PiecePool>(3, 2, 64);
  constexpr size_t kPieces = 400;
  std::vector<std::atomic<int>> runs(kPieces);
  std::atomic<bool> stop_called{false}, stop_returned{false};
  std::atomic<int> helpers_in{0}, late{0};
  bool ok = false;
  std::thread t([&] {
    ok = pool->run(kPieces, [&](size_t i, int slot) {
      runs[i]++;
      if (!slot) {
        std::this_thread::sleep_for(500us);
        return true;
      }
      if (stop_returned) late++;
      helpers_in++;
      if (!stop_called) {
        while (!stop_called) std::this_thread::sleep_for(100us);
        std::this_thread::sleep_for(50ms);
      }
      helpers_in--;
      return true;
    });
  });
  CHECK(eventually([&] { return helpers_in.load() > 0; }), "no helper joined before stop()");
  stop_called = true;
  pool->stop();
  stop_returned = true;
  const int in_at_return = helpers_in;
  t.join();
  CHECK(ok, "the job failed across stop()");
  int wrong = 0;
  for (auto& r : runs) wrong += r.load() != 1;
  CHECK(wrong == 0, "%d pieces did not run exactly once across stop()", wrong);
  CHECK(in_at_return == 0, "stop() returned while %d helpers were still in a piece", in_at_return);
  CHECK(late == 0, "helpers started %d pieces after stop() returned", late.load());
  std::atomic<int> after{0};
  pool->run(20, [&](size_t, int slot) {
    after += slot == 0;
    return true;
  });
  CHECK(after == 20, "a job after stop() was not run by its caller alone");
  pool.reset();
}

// The CRC of pieces computed in any order on any thread, joined in order.
void crc_of_pieces_out_of_order() {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> data((3 << 20) + 100);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = adp::crc32c(data.data(), data.size());
  PiecePool pool(3, 2, 64);
  for (size_t piece : {size_t(4096), size_t(256) << 10, size_t(1) << 20, data.size()}) {
    const size_t n = (data.size() + piece - 1) / piece;
    std::vector<uint32_t> crcs(n);
    std::vector<uint8_t> copy(data.size());
    pool.run(n, [&](size_t i, int) {
      const size_t len = std::min(piece, data.size() - i * piece);
      crcs[i] = adp::crc32c_copy(copy.data() + i * piece, data.data() + i * piece, len);
      return true;
    });
    uint32_t joined = 0;
    for (size_t i = 0; i < n; i++)
      joined = adp::crc32c_combine(joined, crcs[i], std::min(piece, data.size() - i * piece));
    CHECK(joined == whole, "pieces of %zu: joined CRC %08x, whole %08x", piece, joined, whole);
    CHECK(copy == data, "pieces of %zu: the copy differs", piece);
  }
  CHECK(adp::crc32c_combine(adp::crc32c("1234", 4), adp::crc32c("56789", 5), 5) == 0xE3069283u,
        "crc32c_combine of \"1234\" and \"56789\"");
  CHECK(adp::crc32c_combine(adp::crc32c("123456789", 9), 0, 0) == 0xE3069283u, "crc32c_combine with an empty B");
}

}  // namespace

int main() {
  every_piece_once();
  no_spare_cpu_no_helper();
  callers_share_the_cpus();
  helpers_now_and_alone();
  failing_piece_stops_its_job();
  stalled_helper_holds_back_its_job_only();
  stop_with_pieces_in_flight();
  crc_of_pieces_out_of_order();
  return adp::testing::finish("piece_pool_test");
}
