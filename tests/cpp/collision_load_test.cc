// SPDX-License-Identifier: Apache-2.0
// Disk loads (ReadInto::kPieces, 4 KiB aligned buffers: header block and
// payload in one request, the header checked after it) of keys that share
// their 64-bit hash_key with another key (MurmurHash64A with a public seed:
// a collision is solved for, as tests/gateway/test_process_memory.py's
// colliding_keys does). The forged key is stored last. The index is keyed by
// index_hash (SipHash under a per-process secret), narrowed here to 16 bits
// (narrow_index_hash_for_tests) so that the residual case can be made.
// Checks:
//   - a forged key of another index hash (what a client can craft): both
//     objects stay, the victim's load a hit with its own bytes (until
//     session 21 the forged store took the hash's index entry and the
//     victim's load was a miss: another tenant's object evicted);
//   - a forged key of the same index hash (the residual case of
//     docs/card_format.md: searched for here, 2^-64 a pair with the whole
//     hash and not craftable without the secret): it supersedes the victim,
//     whose load reads, finds another key in the header and is a miss; the
//     forged object is not damage (no checksum failure, still indexed);
//   - the forged key loads its own bytes, an object of 8 MiB + 1000 bytes
//     (a partial last block) in one request of 8 MiB + 8 KiB (header block,
//     payload blocks, tail block);
//   - exists() answers from the index hash alone (yes for both keys);
//   - an object that runs from one region into the next one on the card
//     loads in one request too, that region's header block read into a
//     scratch block between (12 MiB regions: the second object spans);
//   - on a memory-backed card whose mapping failed (where a gateway's ring
//     loads in pieces, each published to its client as it lands), a
//     kPieces load of the victim with the forged key of the same index hash runs
//     no piece: the header is checked before any byte reaches the buffer.
// The Connector over the embedded backend, one worker, on a FaultDevice
// that records the size of each read.
//
//   collision_load_test
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "check.h"
#include "connector/connector.h"
#include "forge_key.h"
#include "store/card_format.h"
#include "store/card_store.h"
#include "store/index_hash.h"
#include "test_card.h"
#include "test_connector.h"
#include "testing/fault_device.h"
#include "util/aligned_buffer.h"

namespace {

using adp::Completion;
using adp::OpType;
using adp::testing::check;
using adp::testing::forge;
using adp::testing::run;

// The four objects fit the first region: none spans two (a read in each).
constexpr uint64_t kRegionBytes = 40ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(8, kRegionBytes);
constexpr size_t kObjectBytes = (8u << 20) + 1000;  // more than 4 MiB: read straight into the buffer

// Records the bytes of each read while `counting`.
class CountingDevice : public adp::testing::FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  adp::Status readv(uint64_t offset, const iovec* iov, int count) const override {
    if (counting) {
      uint64_t n = 0;
      for (int i = 0; i < count; i++) n += iov[i].iov_len;
      std::lock_guard<std::mutex> lock(mu);
      sizes.push_back(n);
    }
    return FaultDevice::readv(offset, iov, count);
  }
  std::vector<uint64_t> take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::move(sizes);
  }
  bool counting = false;  // set between loads, on the test's thread
  mutable std::mutex mu;
  mutable std::vector<uint64_t> sizes;
};

std::vector<uint8_t> store(std::shared_ptr<adp::CardStore> s, const std::string& key, uint8_t seed) {
  adp::AlignedBuffer src;
  src.reserve(kObjectBytes);
  const std::vector<uint8_t> want = adp::testing::pattern(kObjectBytes, seed);
  std::memcpy(src.data(), want.data(), kObjectBytes);
  auto c = adp::testing::embedded_connector(s, 1, 30000);
  Completion put = run(*c, OpType::kSet, {key}, {{src.data(), kObjectBytes}});
  check(put.ok, "the store succeeds: " + put.error);
  c->close();
  return want;
}

// Loads key into a 4 KiB aligned buffer of 0x5a; the buffer, the hit flag, and the reads' sizes.
struct Load {
  std::vector<uint8_t> bytes;
  bool hit = false;
  std::vector<uint64_t> reads;
};
Load load(std::shared_ptr<adp::CardStore> s, CountingDevice* dev, const std::string& key) {
  adp::AlignedBuffer mem;
  mem.reserve(kObjectBytes);
  std::memset(mem.data(), 0x5a, kObjectBytes);
  auto c = adp::testing::embedded_connector(s, 1, 30000);
  dev->take();
  dev->counting = true;
  Completion got = run(*c, OpType::kGet, {key}, {{mem.data(), kObjectBytes}});
  dev->counting = false;
  c->close();
  check(got.ok, "the load's future succeeds: " + got.error);
  return {std::vector<uint8_t>(mem.data(), mem.data() + kObjectBytes), got.per_key == std::vector<uint8_t>{1},
          dev->take()};
}

// A memory-speed card (tmpfs) whose mapping failed: mapped() stays nullptr.
class UnmappedMemoryDevice : public adp::testing::FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  bool memory_backed() const override { return true; }
};

// A kPieces load of the victim, forged with its index hash, on an UnmappedMemoryDevice card.
void ring_pieces_on_unmapped_memory_card() {
  auto image = std::make_shared<adp::testing::FaultImage>(kCardBytes);
  std::shared_ptr<adp::CardStore> s = adp::testing::checked_fault_card<UnmappedMemoryDevice>(
      image, adp::testing::card_options(kRegionBytes), "open memory card", nullptr, "unmapped-memory-card");
  if (!s) return;
  check(s->memory_speed(), "the memory card is memory-speed");
  const std::string victim = "collide@victim#3", forged = forge(victim, true);
  store(s, victim, 3);
  store(s, forged, 4);
  adp::AlignedBuffer mem;
  mem.reserve(kObjectBytes);
  std::memset(mem.data(), 0x5a, kObjectBytes);
  size_t pieces = 0;
  adp::PieceGuardFn guard = [&](size_t, const std::function<void()>& piece) {
    pieces++;
    piece();
    return true;
  };
  adp::IoContext ctx;
  adp::Status st = s->get(
      ctx, victim, [&](size_t size, const adp::CopyFn& copy) { return size == kObjectBytes && copy(mem.data()); },
      adp::ReadInto::kPieces, guard);
  check(st.is_not_found(), "memory card, same index hash: the victim's load in pieces is a miss: " + st.message());
  check(pieces == 0, "memory card, same index hash: no piece ran before the header was checked (" +
                         std::to_string(pieces) + " ran)");
  check(std::vector<uint8_t>(mem.data(), mem.data() + kObjectBytes) == std::vector<uint8_t>(kObjectBytes, 0x5a),
        "memory card, same index hash: the buffer is untouched");
}

std::string sizes(const std::vector<uint64_t>& v);

// Two objects on a new card of 12 MiB regions: the second runs from region 0 into region 1.
void spanning_object_in_one_request() {
  auto image = std::make_shared<adp::testing::FaultImage>(adp::testing::card_bytes(8, 12ull << 20));
  CountingDevice* dev = nullptr;
  std::shared_ptr<adp::CardStore> s =
      adp::testing::checked_fault_card(image, adp::testing::card_options(12ull << 20), "open 12 MiB regions", &dev);
  if (!s) return;
  store(s, "span@first", 5);
  const std::vector<uint8_t> want = store(s, "span@second", 6);
  Load got = load(s, dev, "span@second");
  check(got.hit && got.bytes == want, "spanning: the object spanning two regions loads its bytes");
  const std::vector<uint64_t> one{(8u << 20) + 3 * adp::kBlockSize};
  check(got.reads == one,
        "spanning: one request: header, payload, the next region's header block, tail (read:" + sizes(got.reads) + ")");
}

std::string sizes(const std::vector<uint64_t>& v) {
  std::string out;
  for (uint64_t n : v) out += " " + std::to_string(n);
  return out;
}

}  // namespace

int main() {
  adp::narrow_index_hash_for_tests(16);  // before any key is hashed
  auto image = std::make_shared<adp::testing::FaultImage>(kCardBytes);
  CountingDevice* dev = nullptr;
  std::shared_ptr<adp::CardStore> s =
      adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes), "open", &dev, "count-card");
  if (!s) return 1;
  check(!s->memory_speed(), "the test card is not memory-speed (its loads read into the buffer)");

  for (bool same_index : {false, true}) {
    const std::string victim = same_index ? "collide@victim#2" : "collide@victim#1";
    const std::string forged = forge(victim, same_index);
    const std::string what = same_index ? "same index hash: " : "other index hash: ";
    check(adp::hash_key(forged) == adp::hash_key(victim), what + "the forged key has the victim's hash_key");
    const std::vector<uint8_t> victim_bytes = store(s, victim, 1);
    const uint64_t objects = s->stats().objects;
    const std::vector<uint8_t> want = store(s, forged, 2);
    // exists() answers from the index hash alone: yes for the victim in the residual case too (its load misses).
    check(s->exists(forged) && s->exists(victim), what + "exists(): both keys");
    check(s->stats().objects == objects + (same_index ? 0 : 1), what + "the forged key's object is counted beside");
    const uint64_t failures = s->stats().checksum_failures;

    Load v = load(s, dev, victim);
    if (same_index) {
      check(!v.hit, what + "the victim's load is a miss");
    } else {
      check(v.hit && v.bytes == victim_bytes, what + "the victim's load is a hit with its own bytes");
      check(v.reads == std::vector<uint64_t>{(8u << 20) + 2 * adp::kBlockSize},
            what + "the victim's load is one request (read:" + sizes(v.reads) + ")");
    }
    check(s->stats().checksum_failures == failures, what + "another key's object is no damage");

    Load f = load(s, dev, forged);
    check(f.hit && f.bytes == want, what + "the forged key loads its own bytes");
    const std::vector<uint64_t> one{(8u << 20) + 2 * adp::kBlockSize};
    check(f.reads == one, what + "in one request: header, payload and tail blocks (read:" + sizes(f.reads) + ")");
  }
  spanning_object_in_one_request();
  ring_pieces_on_unmapped_memory_card();
  return adp::testing::finish("collision_load_test");
}
