// SPDX-License-Identifier: Apache-2.0
// What a delete reports to LMCache (docs: README "adapter_params", the
// connector's result reporting). LMCache reads only the per-key bools of a
// delete: true lets it forget the key, false keeps it to evict again. So:
//   - a key deleted now, or not on the card, is true (it is gone);
//   - a delete whose tombstone could not be written (an I/O error) is false,
//     fails the future with an error naming the key, and leaves the object
//     readable.
// The Connector over the embedded backend, on a FaultDevice card.
//
//   delete_result_test
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "connector/connector.h"
#include "store/card_store.h"
#include "test_card.h"
#include "test_connector.h"
#include "testing/fault_device.h"

namespace {

using adp::Completion;
using adp::Connector;
using adp::OpType;

constexpr uint64_t kCardBytes = 32ull << 20;
constexpr uint64_t kRegionBytes = 1ull << 20;

using adp::testing::check;
using adp::testing::run;

}  // namespace

int main() {
  adp::testing::FaultDevice* faults;
  std::shared_ptr<adp::CardStore> store =
      adp::testing::checked_fault_card(std::make_shared<adp::testing::FaultImage>(kCardBytes),
                                       adp::testing::card_options(kRegionBytes), "open", &faults, "delete-result-card");
  if (!store) return 1;
  std::unique_ptr<Connector> conn = adp::testing::embedded_connector(std::move(store), 2, 10000);
  Connector& c = *conn;

  std::vector<uint8_t> a(100000, 0xa1), b(100000, 0xb2);
  Completion put = run(c, OpType::kSet, {"m@0@0@a", "m@0@0@b"}, {{a.data(), a.size()}, {b.data(), b.size()}});
  check(put.ok, "the two stores succeed: " + put.error);

  // Deleted now, and never there: both gone, so both true, and the future is ok.
  Completion del = run(c, OpType::kDelete, {"m@0@0@a", "m@0@0@never-stored"});
  check(del.ok && del.error.empty(), "a delete of a present and an absent key is ok: " + del.error);
  check(del.per_key == std::vector<uint8_t>{1, 1}, "deleted and absent keys are both reported gone (true)");
  Completion ex = run(c, OpType::kExists, {"m@0@0@a"});
  check(ex.ok && ex.per_key == std::vector<uint8_t>{0}, "the deleted key is not found");

  // The card refuses every write: the tombstone of b cannot be written.
  faults->fail_writes(0, kCardBytes);
  Completion failed = run(c, OpType::kDelete, {"m@0@0@b", "m@0@0@also-absent"});
  check(!failed.ok, "a delete whose tombstone write failed fails the future");
  check(failed.error.find("delete of key m@0@0@b failed") != std::string::npos,
        "the error names the key that failed: '" + failed.error + "'");
  check(failed.per_key.size() == 2 && failed.per_key[0] == 0, "the failed key is reported not deleted (false)");
  check(failed.per_key.size() == 2 && failed.per_key[1] == 1, "the absent key of the same batch is still gone (true)");

  // Nothing was deleted: b is still there and reads back whole.
  std::vector<uint8_t> got(b.size(), 0);
  Completion get = run(c, OpType::kGet, {"m@0@0@b"}, {{got.data(), got.size()}});
  check(get.ok && get.per_key == std::vector<uint8_t>{1} && got == b, "the key whose delete failed reads back");

  c.close();
  return adp::testing::finish("delete_result_test");
}
