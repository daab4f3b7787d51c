// SPDX-License-Identifier: Apache-2.0
// CardStore::get_via_bounce with its pieces on a PiecePool, as the gateway's
// process loads run it: every byte lands where it belongs at sizes around the
// 256 KiB piece, from several threads at once (the CRC joined over pieces
// done out of order); a sink that refuses a piece ends the load TimedOut and
// no piece starts after; two loaders share the pool. The larger pieces of an
// object written alone (kLargeBouncePieceBytes, run alone on the pool): bytes
// right at sizes around 1 MiB and 2 MiB + 4 KiB, the pieces' offsets and
// lengths, no helper, a refusal at the second piece, and a damaged byte in the
// second piece a miss (counted, dropped). Argument: the card image
// (on tmpfs: pieces from the mapping; elsewhere: the object staged, then
// written out in pieces). Built and run by tests/store/test_bounce_load.py
// (also under ASan and TSan).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "util/piece_pool.h"

namespace {

using adp::AlignedBuffer;
using adp::CardStore;
using adp::IoContext;
using adp::PiecePool;
using adp::Status;
using adp::testing::pattern;
using adp::testing::put_one;

// One loader's state, as a gateway connection keeps it.
struct Loader {
  AlignedBuffer bounces[3];
  AlignedBuffer hold;
};

// Loads key into out (its size) through the pool; sink_ok(done) may refuse a
// piece. piece_bytes (0: the default): the pieces' size, run alone on the
// pool (as the gateway runs the larger ones); seen: each piece's (offset,
// length) as the sink got it.
Status load(CardStore& s, PiecePool& pool, Loader& l, const std::string& key, std::vector<uint8_t>* out,
            const std::function<bool(size_t done)>& sink_ok = {}, size_t piece_bytes = 0,
            std::vector<std::pair<size_t, size_t>>* seen = nullptr) {
  std::mutex seen_mu;
  auto accept = [&](size_t size) { return size == out->size(); };
  auto with_ctx = [](const std::function<void(IoContext&)>& fn) {
    IoContext ctx;
    fn(ctx);
    return true;
  };
  auto sink = [&](size_t done, const uint8_t* src, size_t len) {
    if (seen) {
      std::lock_guard<std::mutex> lock(seen_mu);
      seen->emplace_back(done, len);
    }
    if (sink_ok && !sink_ok(done)) return false;
    std::memcpy(out->data() + done, src, len);
    return true;
  };
  auto run = [&](size_t n, const PiecePool::PieceFn& piece) { return pool.run(n, piece, piece_bytes != 0); };
  return s.get_via_bounce(key, accept, with_ctx, {l.bounces, 3}, &l.hold, sink, run, piece_bytes);
}

// n bytes of splitmix64 (pattern()'s bytes repeat every 16 MiB: the 64
// bytes damage() looks for would occur in several objects).
std::vector<uint8_t> unique_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(v.data() + i, &z, std::min<size_t>(8, n - i));
  }
  return v;
}

// Flips the byte `at` bytes into data (an object's payload) on the card
// image, found by the 64 bytes from there (they occur once on the card).
bool damage(const char* image, const std::vector<uint8_t>& data, size_t at) {
  const int fd = ::open(image, O_RDWR);
  if (fd < 0) return false;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  std::vector<uint8_t> all(static_cast<size_t>(size));
  bool ok = ::pread(fd, all.data(), all.size(), 0) == size;
  const auto needle = data.begin() + static_cast<long>(at);
  auto found = std::search(all.begin(), all.end(), needle, needle + 64);
  ok = ok && found != all.end() && std::search(found + 1, all.end(), needle, needle + 64) == all.end();
  if (ok) {
    const uint8_t flipped = *found ^ 1;
    ok = ::pwrite(fd, &flipped, 1, found - all.begin()) == 1;
  }
  ::close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  if (!adp::testing::one_argument(argc, argv, "CARD_IMAGE", &path)) return 2;
  std::remove(path.c_str());
  // Regions of 4 MiB: objects over 4 MiB span regions.
  auto s = adp::testing::checked_card(adp::testing::card_options(4ull << 20, path, 128ull << 20), "open " + path);
  if (!s) return 1;
  const std::vector<size_t> sizes = {1, 4096, 256 << 10, (256 << 10) + 1, (3 << 20) + 100, (9 << 20) + 4099};
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < sizes.size(); i++) {
    data.push_back(pattern(sizes[i], static_cast<uint8_t>(i + 1)));
    IoContext ctx;
    Status r = put_one(*s, ctx, "k" + std::to_string(i), data.back());
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

  // The larger pieces (1 MiB) of an object its own thread writes alone.
  {
    const size_t big = CardStore::kLargeBouncePieceBytes;
    const std::vector<size_t> large = {big - 1, big, big + 1, (2u << 20) + 4096, (9u << 20) + 4099};
    std::vector<std::vector<uint8_t>> ldata;
    for (size_t i = 0; i < large.size(); i++) {
      ldata.push_back(unique_bytes(large[i], 100 + i));
      IoContext ctx;
      Status r = put_one(*s, ctx, "L" + std::to_string(i), ldata.back());
      CHECK(r.ok(), "put of %zu bytes: %s", large[i], r.message().c_str());
    }
    const uint64_t helped = pool.helped_pieces();
    for (int rep = 0; rep < 2; rep++)
      for (size_t i = 0; i < large.size(); i++) {
        std::vector<uint8_t> out(large[i], 0x5a);
        std::vector<std::pair<size_t, size_t>> seen;
        Status r = load(*s, pool, l, "L" + std::to_string(i), &out, {}, big, &seen);
        CHECK(r.ok(), "load of %zu bytes in 1 MiB pieces: %s", large[i], r.message().c_str());
        CHECK(out == ldata[i], "load of %zu bytes in 1 MiB pieces: other bytes", large[i]);
        const size_t n = (large[i] + big - 1) / big;
        CHECK(seen.size() == n, "%zu bytes: %zu pieces, not %zu", large[i], seen.size(), n);
        for (size_t p = 0; p < seen.size(); p++)  // in order: on this thread alone
          CHECK(seen[p].first == p * big && seen[p].second == std::min(big, large[i] - p * big),
                "%zu bytes: piece %zu at %zu of %zu bytes", large[i], p, seen[p].first, seen[p].second);
      }
    CHECK(pool.helped_pieces() == helped, "a helper wrote %llu pieces of objects run alone",
          static_cast<unsigned long long>(pool.helped_pieces() - helped));

    // A sink that refuses the second piece: TimedOut after exactly two.
    {
      std::vector<uint8_t> out(large[3], 0x5a);
      std::vector<std::pair<size_t, size_t>> seen;
      Status r = load(*s, pool, l, "L3", &out, [&](size_t done) { return done != big; }, big, &seen);
      CHECK(r.code() == Status::Code::kTimedOut, "a refused 1 MiB piece: %s", r.message().c_str());
      CHECK(seen.size() == 2, "%zu pieces went to the sink, not 2 (the refused one the last)", seen.size());
      CHECK(std::equal(out.begin(), out.begin() + big, ldata[3].begin()), "the first 1 MiB piece differs");
      CHECK(std::all_of(out.begin() + big, out.end(), [](uint8_t b) { return b == 0x5a; }),
            "bytes landed from the refused piece on");
    }

    // A damaged byte in the second piece of the 2 MiB + 4 KiB object: a
    // miss, counted once, the object dropped; the others still load.
    {
      const uint64_t failures = s->stats().checksum_failures;
      CHECK(damage(path.c_str(), ldata[3], big + 4097),
            "the object's bytes at 1 MiB + 4097 not found once on the card");
      std::vector<uint8_t> out(large[3]);
      Status r = load(*s, pool, l, "L3", &out, {}, big);
      CHECK(r.is_not_found(), "a damaged object in 1 MiB pieces: %s", r.message().c_str());
      CHECK(s->stats().checksum_failures == failures + 1, "the damage counted %llu times",
            static_cast<unsigned long long>(s->stats().checksum_failures - failures));
      CHECK(!s->exists("L3"), "the damaged object is still indexed");
      std::vector<uint8_t> other(large[4]);
      CHECK(load(*s, pool, l, "L4", &other, {}, big).ok() && other == ldata[4], "another object after the damage");
    }
  }
  s.reset();
  std::remove(path.c_str());
  return adp::testing::finish("bounce_load_test");
}
