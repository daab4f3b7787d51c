// SPDX-License-Identifier: Apache-2.0
// CardStore::get_via_bounce with its pieces on a PiecePool, as the gateway's
// process loads run it: every byte lands where it belongs at sizes around the
// 256 KiB piece, from several threads at once (the CRC joined over pieces
// done out of order); a sink that refuses a piece ends the load TimedOut and
// no piece starts after; two loaders share the pool. Argument: the card image
// (on tmpfs: pieces from the mapping; elsewhere: the object staged, then
// written out in pieces). Built and run by tests/store/test_bounce_load.py
// (also under ASan and TSan).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "util/piece_pool.h"

namespace {

using adp::AlignedBuffer;
using adp::CardOptions;
using adp::CardStore;
using adp::IoContext;
using adp::PiecePool;
using adp::PutItem;
using adp::Status;
using adp::testing::pattern;

// One loader's state, as a gateway connection keeps it.
struct Loader {
  AlignedBuffer bounces[3];
  AlignedBuffer hold;
};

// Loads key into out (its size) through the pool; sink_ok(done) may refuse a piece.
Status load(CardStore& s, PiecePool& pool, Loader& l, const std::string& key, std::vector<uint8_t>* out,
            const std::function<bool(size_t done)>& sink_ok = {}) {
  auto accept = [&](size_t size) { return size == out->size(); };
  auto with_ctx = [](const std::function<void(IoContext&)>& fn) {
    IoContext ctx;
    fn(ctx);
    return true;
  };
  auto sink = [&](size_t done, const uint8_t* src, size_t len) {
    if (sink_ok && !sink_ok(done)) return false;
    std::memcpy(out->data() + done, src, len);
    return true;
  };
  auto run = [&](size_t n, const PiecePool::PieceFn& piece) { return pool.run(n, piece); };
  return s.get_via_bounce(key, accept, with_ctx, {l.bounces, 3}, &l.hold, sink, run);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CARD_IMAGE\n", argv[0]);
    return 2;
  }
  std::remove(argv[1]);
  CardOptions co;
  co.path = argv[1];
  co.create_bytes = 128ull << 20;
  co.region_bytes = 4ull << 20;  // objects over 4 MiB span regions
  std::unique_ptr<CardStore> s;
  Status st = CardStore::Open(co, &s);
  if (!st.ok()) {
    std::fprintf(stderr, "open: %s\n", st.message().c_str());
    return 1;
  }
  const std::vector<size_t> sizes = {1, 4096, 256 << 10, (256 << 10) + 1, (3 << 20) + 100, (9 << 20) + 4099};
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < sizes.size(); i++) {
    data.push_back(pattern(sizes[i], static_cast<uint8_t>(i + 1)));
    IoContext ctx;
    const std::string key = "k" + std::to_string(i);
    PutItem item{key, data.back().data(), sizes[i]};
    Status r;
    s->put(ctx, &item, 1, &r, [] { return true; });
    CHECK(r.ok(), "put of %zu bytes: %s", sizes[i], r.message().c_str());
  }
  PiecePool pool(4, 2, 64);
  Loader l;
  for (int rep = 0; rep < 3; rep++)
    for (size_t i = 0; i < sizes.size(); i++) {
      std::vector<uint8_t> out(sizes[i], 0x5a);
      Status r = load(*s, pool, l, "k" + std::to_string(i), &out);
      CHECK(r.ok(), "load of %zu bytes: %s", sizes[i], r.message().c_str());
      CHECK(out == data[i], "load of %zu bytes: other bytes", sizes[i]);
    }
  std::printf("memory_speed=%d helped=%llu\n", s->memory_speed() ? 1 : 0,
              static_cast<unsigned long long>(pool.helped_pieces()));
  CHECK(pool.helped_pieces() > 0, "no piece of a 9 MiB object was written by a helper");

  // A sink that refuses the piece at 1 MiB: TimedOut, not every piece went
  // out, and none starts after the load returned.
  {
    std::vector<uint8_t> out(sizes.back(), 0x5a);
    std::atomic<int> calls{0};
    Status r = load(*s, pool, l, "k5", &out, [&](size_t done) {
      calls++;
      return done != (1u << 20);
    });
    const int at_return = calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(r.code() == Status::Code::kTimedOut, "a refused piece: %s", r.message().c_str());
    CHECK(calls == at_return, "%d pieces went to the sink after the load returned", calls.load() - at_return);
    CHECK(at_return < 38, "every piece went out after one was refused");
    std::vector<uint8_t> again(sizes.back());
    CHECK(load(*s, pool, l, "k5", &again).ok() && again == data.back(), "the object loads whole after a refusal");
  }

  // A miss, and a buffer of another size: NotFound, nothing delivered.
  {
    std::vector<uint8_t> out(100, 0x5a);
    CHECK(load(*s, pool, l, "absent", &out).is_not_found(), "a miss");
    CHECK(load(*s, pool, l, "k4", &out).is_not_found(), "another size");
    CHECK(out == std::vector<uint8_t>(100, 0x5a), "a miss wrote into the buffer");
  }

  // Two loaders at once on one pool.
  {
    std::atomic<int> bad{0};
    auto loader = [&](int seed) {
      Loader mine;
      for (int rep = 0; rep < 10; rep++) {
        const size_t i = (rep + seed) % sizes.size();
        std::vector<uint8_t> out(sizes[i]);
        if (!load(*s, pool, mine, "k" + std::to_string(i), &out).ok() || out != data[i]) bad++;
      }
    };
    std::thread a(loader, 0), b(loader, 3);
    a.join();
    b.join();
    CHECK(bad == 0, "%d loads failed or differed with two loaders", bad.load());
  }
  const auto stats = s->stats();
  CHECK(stats.checksum_failures == 0, "checksum failures: %llu",
        static_cast<unsigned long long>(stats.checksum_failures));
  s.reset();
  std::remove(argv[1]);
  if (adp::testing::check_failures) {
    std::printf("bounce_load_test: %d checks failed\n", adp::testing::check_failures);
    return 1;
  }
  std::printf("bounce_load_test: PASS\n");
  return 0;
}
