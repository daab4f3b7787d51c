// SPDX-License-Identifier: Apache-2.0
// Stores from 4 KiB-aligned memory on a disk card (the FaultDevice is not
// memory-backed): the zero-copy path, and for objects of 1 MiB or more the
// body written while the IoContext's CrcWorker checksums it, then the
// header. Checked on the fault device:
//   1. such objects (whole blocks, a partial last block, spanning regions)
//      read back byte-exact, before and after a reopen;
//   2. a power cut at every write of such a store, whole and torn: after the
//      reopen the object acknowledged before is intact, the cut one is absent
//      (never served with other bytes), and the card takes a new store;
//   3. a failed write of its body or of its header: the store fails, the
//      card and the same IoContext go on storing; a failed write of a
//      region's header (the frontier opening a region the store continues
//      into) is the exception: another region opens and the store, if
//      acknowledged, reads back byte-exact (session 33, review33a F5).
//
//   disk_store_test
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::CardStore;
using adp::IoContext;
using adp::Status;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;

constexpr uint64_t kRegionBytes = 1ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(16, kRegionBytes);

// 4 KiB-aligned bytes of value v: what an LMCache buffer with
// --l1-align-bytes 4096 looks like to the store.
struct Value {
  Value(uint64_t v, size_t n) : size(n) {
    void* p = nullptr;
    if (posix_memalign(&p, adp::kBlockSize, n + adp::kBlockSize) != 0) std::abort();
    data.reset(static_cast<uint8_t*>(p));
    uint64_t x = v * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      data.get()[i] = static_cast<uint8_t>(x);
    }
  }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data;
  size_t size;
  bool same(const std::vector<uint8_t>& got) const {
    return got.size() == size && std::memcmp(got.data(), data.get(), size) == 0;
  }
};

// The store on a new device over `image` (blank: the first open formats it), or nullptr (a CHECK
// failed: `what`); *dev: the device.
std::unique_ptr<CardStore> open_store(const std::shared_ptr<FaultImage>& image, FaultDevice** dev,
                                      const std::string& what) {
  return adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes), what, dev);
}

Status put(CardStore& s, IoContext& ctx, const std::string& key, const Value& v) {
  return adp::testing::put_one(s, ctx, key, v.data.get(), v.size);
}

// The object's bytes (read through an IoContext of its own), or nothing on a miss (NotFound) or an error.
std::optional<std::vector<uint8_t>> load(CardStore& s, const std::string& key) {
  IoContext ctx;
  return adp::testing::read_object(s, ctx, key);
}

// Sizes that take the overlapped path: whole blocks, a partial last block,
// and one spanning three regions.
const std::vector<size_t> kSizes = {1u << 20, (3u << 19) + 123, (5u << 19) + 4096 * 3 + 7};

void round_trip() {
  auto image = std::make_shared<FaultImage>(kCardBytes);
  FaultDevice* dev;
  auto s = open_store(image, &dev, "open");
  IoContext ctx;
  std::vector<Value> values;
  for (size_t i = 0; i < kSizes.size(); i++) {
    values.emplace_back(i + 1, kSizes[i]);
    Status r = put(*s, ctx, "k" + std::to_string(i), values.back());
    CHECK(r.ok(), "store of %zu bytes: %s", kSizes[i], r.message().c_str());
  }
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < values.size(); i++) {
      auto got = load(*s, "k" + std::to_string(i));
      CHECK(got && values[i].same(*got), "%s: object of %zu bytes does not read back", pass ? "reopened" : "stored",
            kSizes[i]);
    }
    s.reset();
    s = open_store(image, &dev, "reopen");
  }
}

// A fresh card on which `before` is stored and acknowledged.
struct CardWithOne {
  explicit CardWithOne(const Value& before) : image(std::make_shared<FaultImage>(kCardBytes)) {
    s = open_store(image, &dev, "open");
    CHECK(put(*s, ctx, "before", before).ok(), "store before");
  }
  std::shared_ptr<FaultImage> image;
  FaultDevice* dev = nullptr;
  std::unique_ptr<CardStore> s;
  IoContext ctx;
};

// The writes a store of `cut` makes after `before`, without a fault.
uint64_t writes_of_store(const Value& before, const Value& cut) {
  CardWithOne c(before);
  uint64_t w0 = c.dev->writes();
  CHECK(put(*c.s, c.ctx, "cut", cut).ok(), "store cut");
  return c.dev->writes() - w0;
}

void power_cuts(const Value& before, const Value& cut) {
  const uint64_t n = writes_of_store(before, cut);
  CHECK(n >= 2, "a store of %zu bytes from aligned memory made %" PRIu64 " writes (body, then header)", cut.size, n);
  for (uint64_t point = 0; point < n; point++) {
    for (bool tear : {false, true}) {
      CardWithOne c(before);
      c.dev->cut_power_at_write(c.dev->writes() + point, tear ? adp::kBlockSize : 0);
      Status r = put(*c.s, c.ctx, "cut", cut);
      CHECK(!r.ok(), "cut at write %" PRIu64 " of the store: acknowledged", point);
      c.s.reset();
      c.s = open_store(c.image, &c.dev, "reopen after cut at write " + std::to_string(point));
      auto b = load(*c.s, "before");
      CHECK(b && before.same(*b), "cut at write %" PRIu64 "%s: the object stored before is not intact", point,
            tear ? " (torn)" : "");
      auto got = load(*c.s, "cut");
      CHECK(!got, "cut at write %" PRIu64 "%s: the store cut off is served (%zu bytes)", point, tear ? " (torn)" : "",
            got ? got->size() : 0);
      CHECK(put(*c.s, c.ctx, "after", cut).ok(), "cut at write %" PRIu64 ": the card takes no new store", point);
      auto a = load(*c.s, "after");
      CHECK(a && cut.same(*a), "cut at write %" PRIu64 ": the new store does not read back", point);
    }
  }
}

void failed_writes(const Value& before, const Value& cut) {
  const uint64_t n = writes_of_store(before, cut);
  for (uint64_t point = 0; point < n; point++) {
    CardWithOne c(before);
    const uint64_t n_fail = c.dev->writes() + point;
    c.dev->fail_write(n_fail);
    // The card offset of the write that fails: a region header's (the frontier opening a region the store
    // continues into) makes the store go on in another region since session 33 (review33a F5).
    uint64_t failed_at = UINT64_MAX;
    c.dev->observe_writes([&failed_at, n_fail](uint64_t i, uint64_t offset, uint64_t) {
      if (i == n_fail) failed_at = offset;
    });
    Status r = put(*c.s, c.ctx, "cut", cut);
    const bool region_header =
        failed_at != UINT64_MAX && failed_at >= adp::kDataOffset && (failed_at - adp::kDataOffset) % kRegionBytes == 0;
    CHECK(!r.ok() || region_header, "failed write %" PRIu64 " of the store: acknowledged", point);
    if (r.ok()) {
      auto got = load(*c.s, "cut");
      CHECK(got && cut.same(*got),
            "failed write %" PRIu64 " (a region header's: another region opened): the store does not read back", point);
    } else {
      CHECK(!load(*c.s, "cut"), "failed write %" PRIu64 ": the failed store is served", point);
    }
    // The same IoContext (and its CrcWorker) stores again.
    Status again = put(*c.s, c.ctx, "again", cut);
    CHECK(again.ok(), "failed write %" PRIu64 ": the next store fails: %s", point, again.message().c_str());
    auto g = load(*c.s, "again");
    CHECK(g && cut.same(*g), "failed write %" PRIu64 ": the next store does not read back", point);
    auto b = load(*c.s, "before");
    CHECK(b && before.same(*b), "failed write %" PRIu64 ": the object stored before is not intact", point);
  }
}

}  // namespace

int main() {
  round_trip();
  Value before(100, (3u << 19) + 5);
  for (size_t size : kSizes) {
    Value cut(200 + size, size);
    power_cuts(before, cut);
    failed_writes(before, cut);
  }
  return adp::testing::finish("disk_store_test");
}
