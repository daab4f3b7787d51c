// SPDX-License-Identifier: Apache-2.0
// Stores of a key forged to share its 64-bit hash_key with another key's
// (tests/cpp/forge_key.h: MurmurHash64A with a public seed, a collision
// solved for) leave that key's object alone: the index is keyed by
// index_hash (SipHash under a per-process secret), and a tombstone names its
// key (format 4). Until session 21 the index was keyed by hash_key and the
// forged store took the victim's entry, marking its object deleted: a
// client storing through a shared gateway could evict another tenant's
// object. Checks, on a FaultDevice card driven directly:
//   - both objects stay after the forged store, each loading its own bytes,
//     counted as two objects; a re-store of the forged key supersedes its
//     own copy only;
//   - both survive a reopen (recovery) with their bytes;
//   - deleting the forged key (the newer one: its tombstone's seq is above
//     the victim's) leaves the victim, also after a reopen (a tombstone that
//     named only the hash would delete it at recovery); deleting the victim
//     then leaves the forged key's newer copy, after a reopen too;
//   - on a full card of one object a region, evicting the victim's region
//     removes the victim only (one object evicted), and the forged key's
//     object still loads.
//
//   collision_store_test
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "forge_key.h"
#include "store/card_format.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::testing::check;
using adp::testing::forge;
using adp::testing::pattern;
using adp::testing::put_one;
using adp::testing::read_object;

using Bytes = std::vector<uint8_t>;

// The key's object: its bytes, or nothing on a miss.
std::optional<Bytes> load(adp::CardStore& s, const std::string& key) { return read_object(s, key); }

void store(adp::CardStore& s, const std::string& key, const Bytes& value, const std::string& what) {
  adp::IoContext ctx;
  adp::Status st = put_one(s, ctx, key, value);
  check(st.ok(), what + ": the store succeeds: " + st.message());
}

// Both keys as `victim` and `forged` say (nullopt: a miss), and the object count.
void expect(adp::CardStore& s, const std::string& victim, const std::optional<Bytes>& victim_bytes,
            const std::string& forged, const std::optional<Bytes>& forged_bytes, const std::string& what) {
  check(load(s, victim) == victim_bytes, what + (victim_bytes ? ": the victim loads its own bytes" : ": victim gone"));
  check(load(s, forged) == forged_bytes,
        what + (forged_bytes ? ": the forged key loads its own bytes" : ": forged key gone"));
  check(s.stats().objects == uint64_t(victim_bytes.has_value()) + uint64_t(forged_bytes.has_value()),
        what + ": objects counted " + std::to_string(s.stats().objects));
}

void store_load_delete_reopen() {
  constexpr uint64_t kRegionBytes = 4ull << 20;
  auto image = std::make_shared<adp::testing::FaultImage>(adp::testing::card_bytes(8, kRegionBytes));
  const adp::CardOptions co = adp::testing::card_options(kRegionBytes);
  std::unique_ptr<adp::CardStore> s =
      adp::testing::checked_fault_card<adp::testing::FaultDevice>(image, co, "open", nullptr, "store-card");
  if (!s) return;
  const std::string victim = "store@victim#001", forged = forge(victim, false);  // 16 bytes each (forge_key.h)
  check(adp::hash_key(forged) == adp::hash_key(victim), "the forged key has the victim's hash_key");
  const Bytes v = pattern(100000, 1), f = pattern(70000, 2), f2 = pattern(90000, 3), f3 = pattern(50000, 4);

  store(*s, victim, v, "victim");
  store(*s, forged, f, "forged");
  expect(*s, victim, v, forged, f, "after the forged store");
  store(*s, forged, f2, "forged again");
  expect(*s, victim, v, forged, f2, "after the forged key's re-store (its own copy superseded)");

  s = adp::testing::checked_fault_card<adp::testing::FaultDevice>(image, co, "reopen", nullptr, "store-card");
  if (!s) return;
  check(s->stats().recovered_objects == 2, "reopen: two objects recovered");
  expect(*s, victim, v, forged, f2, "after a reopen");

  adp::IoContext ctx;
  adp::Status st = s->remove(ctx, forged);
  check(st.ok(), "the forged key's delete is done: " + st.message());
  expect(*s, victim, v, forged, std::nullopt, "after the forged key's delete");
  s = adp::testing::checked_fault_card<adp::testing::FaultDevice>(image, co, "reopen after the delete", nullptr,
                                                                  "store-card");
  if (!s) return;
  expect(*s, victim, v, forged, std::nullopt, "after the forged key's delete and a reopen");

  store(*s, forged, f3, "forged a third time");
  st = s->remove(ctx, victim);
  check(st.ok(), "the victim's delete is done: " + st.message());
  expect(*s, victim, std::nullopt, forged, f3, "after the victim's delete");
  s = adp::testing::checked_fault_card<adp::testing::FaultDevice>(image, co, "reopen after the victim's delete",
                                                                  nullptr, "store-card");
  if (!s) return;
  expect(*s, victim, std::nullopt, forged, f3, "after the victim's delete and a reopen");
}

void eviction_removes_only_its_object() {
  // Objects that fill a region each (the region header, then the object's
  // header block and payload): the card holds eight.
  constexpr uint64_t kRegionBytes = adp::kMinRegionBytes;
  constexpr size_t kObjectBytes = kRegionBytes - 2 * adp::kBlockSize;
  auto image = std::make_shared<adp::testing::FaultImage>(adp::testing::card_bytes(8, kRegionBytes));
  std::unique_ptr<adp::CardStore> s = adp::testing::checked_fault_card<adp::testing::FaultDevice>(
      image, adp::testing::card_options(kRegionBytes), "open one-object regions", nullptr, "evict-card");
  if (!s) return;
  const std::string victim_key = "evict@victim#01!", forged_key = forge(victim_key, false);  // 16 bytes each
  const Bytes v = pattern(kObjectBytes, 5), f = pattern(kObjectBytes, 6);
  store(*s, victim_key, v, "victim");
  store(*s, forged_key, f, "forged");
  // Loaded in this order, the victim's region is the least recently used.
  expect(*s, victim_key, v, forged_key, f, "eviction card, both stored");
  for (int i = 0; i < 6; i++) store(*s, "evict@filler#" + std::to_string(i), pattern(kObjectBytes, 10 + i), "filler");
  check(s->stats().objects == 8 && s->stats().evicted_objects == 0, "the card holds eight objects, none evicted");
  store(*s, "evict@filler#6", pattern(kObjectBytes, 16), "the filler that evicts");
  check(s->stats().evicted_objects == 1, "one object evicted: " + std::to_string(s->stats().evicted_objects));
  check(!load(*s, victim_key), "the victim's region was evicted: the victim is gone");
  check(load(*s, forged_key) == f, "the forged key's object, in another region, still loads");
  check(s->stats().objects == 8, "eight objects after the eviction: " + std::to_string(s->stats().objects));
}

}  // namespace

int main() {
  store_load_delete_reopen();
  eviction_removes_only_its_object();
  return adp::testing::finish("collision_store_test");
}
