// SPDX-License-Identifier: Apache-2.0
// A store abandoned after its copy was written (still_wanted() false: the
// caller's deadline passed) must not delete the older copy of the key that is
// still indexed, neither now nor after a clean restart. The abandoned copy is
// marked deleted on the card; that tombstone used to carry the copy's own
// (higher) seq, so recovery's merge let it win over the older live copy and
// the key was lost on reopen (connector_stress: "reopen recovered N objects;
// N+1 were indexed at close"). Deterministic: one thread, a real card image.
//
//   abandoned_put_test CARD_IMAGE   (a path that does not exist yet)
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::testing::check;
using adp::testing::put_one;
using adp::testing::read_object;

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  if (!adp::testing::one_argument(argc, argv, "CARD_IMAGE", &path)) return 2;
  const adp::CardOptions card = adp::testing::card_options(1u << 20, path, 32u << 20);
  const std::vector<uint8_t> v1(5000, 0x11), v2(5000, 0x22), other(3000, 0x33);
  {
    auto s = adp::testing::checked_card(card, "open " + path);
    if (!s) return 1;
    adp::IoContext ctx;
    check(put_one(*s, ctx, "k", v1).ok(), "first store of k succeeds");
    check(put_one(*s, ctx, "k", v2, /*wanted=*/false).code() == adp::Status::Code::kTimedOut,
          "abandoned store of k reports a timeout");
    check(put_one(*s, ctx, "other", other).ok(), "store of another key after it succeeds");
    check(s->stats().objects == 2, "two keys indexed before the restart");
    check(read_object(*s, "k") == v1, "k serves the first copy before the restart");
  }
  for (int reopen = 1; reopen <= 2; reopen++) {
    auto s = adp::testing::checked_card(card, "reopen " + path);
    if (!s) return 1;
    check(s->stats().recovered_objects == 2, "a restart recovers both indexed keys");
    check(read_object(*s, "k") == v1, "k serves the first copy after a restart");
    check(read_object(*s, "other") == other, "the other key reads back after a restart");
  }
  std::remove(path.c_str());
  return adp::testing::finish("abandoned_put_test");
}
