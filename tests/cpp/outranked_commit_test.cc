// SPDX-License-Identifier: Apache-2.0
// A store that commits after a newer copy of its key was indexed and has left the index since. Store A of key K
// is reserved first (the lower seq) and held between its write and its commit (its sync); meanwhile newer copies
// of K are stored and acknowledged on another thread, and the newest leaves the index:
//   - `evicted`: copies C then B (B's commit marks C deleted with C's seq, C's region stays), then B's region is
//     evicted by stores of other keys;
//   - `damaged`: copy B, then a load of K finds B's payload damaged and drops it (its tombstone carries B's seq).
// Then A commits. A's put is acknowledged, and whatever the store answers for K afterwards must be what the card
// gives back after a power cut and a reopen: a tombstone of a higher seq than A's (C's, B's) outranks A at
// recovery, so A must not be indexed (it is superseded, marked deleted). Until session 30 A was indexed: the store
// held K and served A's bytes, and K was lost at the next open (found by tests/cpp/card_crash_mt_test.cc, seed=4
// point=112 with a cut keeping some unsynced writes). Built and run by tests/store/test_tombstone_race.py.
//
//   outranked_commit_test [evicted | damaged]   (both without an argument)
#include <cinttypes>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "held_sync.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::Status;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;
using adp::testing::HeldSync;
using adp::testing::t_hold_sync;

constexpr uint64_t kRegion = 1u << 20, kRegions = 8;
constexpr uint64_t kUsable = kRegion - adp::kBlockSize;  // a region's bytes after its header
const adp::CardOptions kCard = adp::testing::card_options(kRegion);

std::vector<uint8_t> value(uint8_t fill, size_t size) { return std::vector<uint8_t>(size, fill); }

// The image offset of the header block of K's copy with the highest seq (ObjectHeader: seq at 24, key at 64).
uint64_t newest_header(const FaultImage& image, const std::string& key) {
  uint64_t best = UINT64_MAX, best_seq = 0;
  for (uint64_t at = adp::kDataOffset; at + adp::kBlockSize <= image.data.size(); at += adp::kBlockSize) {
    const uint8_t* b = image.data.data() + at;
    if (std::memcmp(b, "ADPOBJT1", 8) != 0 || std::memcmp(b + 64, key.data(), key.size()) != 0) continue;
    uint64_t seq;
    std::memcpy(&seq, b + 24, sizeof seq);
    if (seq > best_seq) best = at, best_seq = seq;
  }
  return best;
}

void run(bool evicted) {
  const char* what = evicted ? "evicted" : "damaged";
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(kRegions, kRegion));
  HeldSync* dev = nullptr;
  auto s = adp::testing::checked_fault_card<HeldSync>(image, kCard, std::string(what) + ": open", &dev);
  if (!s) return;
  // A first store opens the first region (A's only sync is then its put's). It, A, then C fill that region
  // exactly; B the next one: B's region can be evicted while A's (pinned by A in flight) and C's tombstone in it
  // stay.
  adp::IoContext ctx;
  const auto w = value(0x1, adp::kBlockSize);
  CHECK(adp::testing::put_one(*s, ctx, "W", w).ok(), "%s: the first store", what);
  const size_t a_size = 10 * adp::kBlockSize;
  const size_t c_size = kUsable - adp::object_footprint(w.size()) - adp::object_footprint(a_size) - adp::kBlockSize;
  const size_t b_size = kUsable - adp::kBlockSize;
  const auto a = value(0xa, a_size), b = value(0xb, b_size), c = value(0xc, c_size);

  Status a_result;
  std::thread writer([&] {
    t_hold_sync = true;
    adp::IoContext ctx;
    a_result = adp::testing::put_one(*s, ctx, "K", a);
  });
  dev->wait_held();  // A written, its ticket resolved, not committed
  if (evicted) {
    CHECK(adp::testing::put_one(*s, ctx, "K", c).ok(), "%s: store of C", what);
    CHECK(adp::testing::put_one(*s, ctx, "K", b).ok(), "%s: store of B (marks C deleted)", what);
    // Other keys, a region each: the free regions, then B's, the least recently used one not pinned (no lookup of
    // K meanwhile: a lookup refreshes its region).
    for (uint64_t i = 0; i < kRegions - 1; i++)
      CHECK(adp::testing::put_one(*s, ctx, "filler" + std::to_string(i), value(uint8_t(i), b_size)).ok(),
            "%s: store of filler %" PRIu64, what, i);
    CHECK(!s->exists("K"), "%s: B was never evicted", what);
  } else {
    CHECK(adp::testing::put_one(*s, ctx, "K", b).ok(), "%s: store of B", what);
    const uint64_t hb = newest_header(*image, "K");
    CHECK(hb != UINT64_MAX, "%s: B's header not found on the card", what);
    if (hb == UINT64_MAX) return;
    image->data[hb + adp::kBlockSize + 100] ^= 0xff;  // B's payload damaged
    Status st;
    CHECK(!adp::testing::read_object(*s, ctx, "K", &st), "%s: the damaged copy B was served", what);
    CHECK(s->stats().checksum_failures == 1, "%s: B's damage not counted (%s)", what, st.message().c_str());
    CHECK(!s->exists("K"), "%s: B was not dropped at its failed load", what);
  }
  dev->release();
  writer.join();
  CHECK(a_result.ok(), "%s: A's store not acknowledged: %s", what, a_result.message().c_str());

  // What the store answers for K now must be what the card gives back after a power cut.
  const bool held = s->exists("K");
  const auto served = adp::testing::read_object(*s, ctx, "K");
  CHECK(held == served.has_value(), "%s: K held %d, a load of it %s", what, held, served ? "hit" : "missed");
  dev->power_cut();
  s.reset();
  auto r = adp::testing::checked_fault_card(image, kCard, std::string(what) + ": reopen");
  if (!r) return;
  const auto back = adp::testing::read_object(*r, "K");
  CHECK(held == back.has_value(), "%s: K %s before the power cut, %s after the reopen", what,
        held ? "held" : "not held", back ? "back" : "lost");
  if (back) CHECK(*back == a, "%s: K came back with bytes that are not A's", what);
  std::printf("outranked_commit_test: %s: A acknowledged, K %s before the power cut and %s after the reopen\n", what,
              held ? "held" : "not held", back ? "back" : "absent");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (only.empty() || only == "evicted") run(true);
  if (only.empty() || only == "damaged") run(false);
  return adp::testing::finish("outranked_commit_test");
}
