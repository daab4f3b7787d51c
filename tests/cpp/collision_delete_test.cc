// SPDX-License-Identifier: Apache-2.0
// Deletes of keys that share their 64-bit hash_key with a stored key (a
// forged key, tests/cpp/forge_key.h). The index is keyed by index_hash
// (SipHash under a per-process secret), narrowed here to 16 bits
// (narrow_index_hash_for_tests) so that two keys of one index hash can be
// made. A delete is exact: it never deletes another key's object.
//   - a forged key of the same index hash (the residual case: 2^-64 a pair
//     with the whole hash, not craftable without the secret): the delete reads the
//     object's header block, finds another key there and is NotFound with
//     nothing written to the card (the image byte for byte as before);
//     through the Connector the forged key is reported gone (true: it is not
//     on the card), as any absent key is (delete_result_test);
//   - a forged key of another index hash: NotFound decided from memory (every
//     read of the card fails meanwhile: none is made);
//   - the victim stays loadable, the counters (deletes, objects, misses,
//     checksum failures, I/O errors) unchanged, and after a restart it is
//     still there (no tombstone of it on the card);
//   - the victim's own delete still deletes it (deletes counted, a miss
//     after, gone after the restart too).
// The card on a FaultDevice, driven directly and through the Connector over
// the embedded backend.
//
//   collision_delete_test
#include <memory>
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

namespace {

using adp::OpType;
using adp::testing::check;
using adp::testing::forge;

constexpr uint64_t kRegionBytes = 4ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(8, kRegionBytes);
constexpr size_t kObjectBytes = 100000;

// What a delete of another key must leave as it was.
struct Counts {
  uint64_t objects, used_bytes, deletes, hits, misses, checksum_failures, io_errors;
  bool operator==(const Counts&) const = default;
};
Counts counts(const adp::CardStore& s) {
  const adp::StoreStats st = s.stats();
  return {st.objects, st.used_bytes, st.deletes, st.hits, st.misses, st.checksum_failures, st.io_errors};
}

// A delete of `forged` (victim's hash) on s: NotFound, nothing written, the victim still indexed, the
// counters unchanged.
void forged_delete_spares(adp::CardStore& s, adp::testing::FaultDevice& dev, const adp::testing::FaultImage& image,
                          const std::string& victim, const std::string& forged, const std::string& what) {
  check(adp::hash_key(forged) == adp::hash_key(victim), what + "the forged key has the victim's hash");
  const Counts before = counts(s);
  const std::vector<uint8_t> card = image.data;
  const uint64_t writes = dev.writes();
  adp::IoContext ctx;
  adp::Status st = s.remove(ctx, forged);
  check(st.is_not_found(), what + "the forged key's delete is NotFound: " + st.message());
  check(dev.writes() == writes && image.data == card, what + "nothing is written to the card");
  check(counts(s) == before, what + "the counters are unchanged");
  check(s.exists(victim), what + "the victim is still indexed");
}

}  // namespace

int main() {
  adp::narrow_index_hash_for_tests(16);  // before any key is hashed
  auto image = std::make_shared<adp::testing::FaultImage>(kCardBytes);
  const adp::CardOptions co = adp::testing::card_options(kRegionBytes);
  adp::testing::FaultDevice* dev = nullptr;
  std::shared_ptr<adp::CardStore> s = adp::testing::checked_fault_card(image, co, "open", &dev, "delete-card");
  if (!s) return 1;
  adp::IoContext ctx;
  const std::string kept = "delete@victim#01", deleted = "delete@victim#02";  // 16 bytes each (forge_key.h)
  const std::vector<uint8_t> kept_bytes = adp::testing::pattern(kObjectBytes, 1);
  const std::vector<uint8_t> deleted_bytes = adp::testing::pattern(kObjectBytes, 2);
  check(adp::testing::put_one(*s, ctx, kept, kept_bytes).ok(), "the first victim is stored");
  check(adp::testing::put_one(*s, ctx, deleted, deleted_bytes).ok(), "the second victim is stored");

  // The same index hash: the header block is read and the whole key compared.
  forged_delete_spares(*s, *dev, *image, deleted, forge(deleted, true), "same index hash: ");
  check(adp::testing::read_object(*s, deleted) == deleted_bytes, "same index hash: the victim still loads its bytes");
  {
    auto c = adp::testing::embedded_connector(s, 1, 30000);
    adp::Completion del = adp::testing::run(*c, OpType::kDelete, {forge(deleted, true)});
    check(del.ok && del.per_key == std::vector<uint8_t>{1},
          "Connector, same index hash: the forged key is reported gone");
    c->close();
  }
  check(adp::testing::read_object(*s, deleted) == deleted_bytes, "Connector, same index hash: the victim still loads");

  // The victim's own delete.
  const uint64_t deletes = s->stats().deletes;
  adp::Status st = s->remove(ctx, deleted);
  check(st.ok(), "the victim's own delete is done: " + st.message());
  check(s->stats().deletes == deletes + 1, "the victim's own delete is counted");
  check(!adp::testing::read_object(*s, deleted), "the deleted victim is a miss");

  // Another index hash: decided from memory, every read of the card failing meanwhile.
  dev->fail_reads(0, kCardBytes);
  forged_delete_spares(*s, *dev, *image, kept, forge(kept, false), "other index hash: ");
  s.reset();

  // A restart (a new device over the same image, no fault armed): no tombstone of the kept victim.
  s = adp::testing::checked_fault_card(image, co, "reopen", &dev, "delete-card");
  if (!s) return 1;
  check(adp::testing::read_object(*s, kept) == kept_bytes, "after a restart the spared victim loads its bytes");
  check(!adp::testing::read_object(*s, deleted), "after a restart the deleted victim stays deleted");
  return adp::testing::finish("collision_delete_test");
}
