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

namespace {

using adp::testing::check;
using adp::testing::check_failures;

adp::Status open_card(const std::string& path, std::unique_ptr<adp::CardStore>* out) {
  adp::CardOptions co;
  co.path = path;
  co.create_bytes = 32u << 20;
  co.region_bytes = 1u << 20;
  return adp::CardStore::Open(co, out);
}

adp::Status put(adp::CardStore& s, adp::IoContext& ctx, const std::string& key, const std::vector<uint8_t>& v,
                bool wanted) {
  adp::PutItem item{key, v.data(), v.size()};
  adp::Status r;
  s.put(ctx, &item, 1, &r, [wanted] { return wanted; });
  return r;
}

bool reads_back(adp::CardStore& s, const std::string& key, const std::vector<uint8_t>& want) {
  adp::IoContext ctx;
  std::vector<uint8_t> got;
  adp::Status st = s.get(ctx, key, [&](size_t size, const adp::CopyFn& copy) {
    got.resize(size);
    return copy(got.data());
  });
  return st.ok() && got == want;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CARD_IMAGE\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const std::vector<uint8_t> v1(5000, 0x11), v2(5000, 0x22), other(3000, 0x33);
  {
    std::unique_ptr<adp::CardStore> s;
    adp::Status st = open_card(path, &s);
    if (!st.ok()) {
      fprintf(stderr, "cannot open %s: %s\n", path.c_str(), st.message().c_str());
      return 1;
    }
    adp::IoContext ctx;
    check(put(*s, ctx, "k", v1, true).ok(), "first store of k succeeds");
    check(put(*s, ctx, "k", v2, false).code() == adp::Status::Code::kTimedOut,
          "abandoned store of k reports a timeout");
    check(put(*s, ctx, "other", other, true).ok(), "store of another key after it succeeds");
    check(s->stats().objects == 2, "two keys indexed before the restart");
    check(reads_back(*s, "k", v1), "k serves the first copy before the restart");
  }
  for (int reopen = 1; reopen <= 2; reopen++) {
    std::unique_ptr<adp::CardStore> s;
    adp::Status st = open_card(path, &s);
    if (!st.ok()) {
      fprintf(stderr, "cannot reopen %s: %s\n", path.c_str(), st.message().c_str());
      return 1;
    }
    check(s->stats().recovered_objects == 2, "a restart recovers both indexed keys");
    check(reads_back(*s, "k", v1), "k serves the first copy after a restart");
    check(reads_back(*s, "other", other), "the other key reads back after a restart");
  }
  std::remove(path.c_str());
  printf("abandoned_put_test: %s\n", check_failures ? "FAIL" : "PASS");
  return check_failures ? 1 : 0;
}
