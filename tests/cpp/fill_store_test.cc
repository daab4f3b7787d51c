// SPDX-License-Identifier: Apache-2.0
// Stores from a source that fills the pieces (PutItem::fill, as a gateway
// reading a client's memory does): on a card image given on the command line
// (on tmpfs: the store fills the card's mapping; elsewhere: staging) and on
// an in-memory fault device (staging, one I/O or pieces). Built and run by
// tests/store/test_fill_store.py, and under ASan and TSan by
// tests/sanitizers/test_sanitizers.py.
//
//   fill_store_test CARD_IMAGE   (a path that does not exist yet)
//
// Checked, on each card:
//   - a fill that fails part way fails that item only: its status is the
//     item's result, nothing of it is indexed or read back, it counts as a
//     store failure but not as a card I/O error, the items before and after
//     it in the batch are stored, and after a reopen the item after it is
//     recovered (the failed place was marked, so recovery steps over it);
//   - a fill whose source changes between (and during) pieces: the object
//     read back is intact (its CRC is of the bytes on the card) and holds the
//     bytes the fill delivered;
//   - an object larger than one staged piece (4 MiB) reads back right;
// and on the fault device, a power cut at every write of a filled store (and
// a failed write at each): an earlier acknowledged object stays, the filled
// one is absent or byte-exact, a failed write counts as an I/O error.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::CardStore;
using adp::IoContext;
using adp::PutItem;
using adp::Status;
using adp::testing::check;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;
using adp::testing::pattern;
using adp::testing::read_object;

constexpr uint64_t kCardBytes = 64ull << 20;
constexpr uint64_t kRegionBytes = 4ull << 20;  // a, b and c below share one region

// A fill from `src` that fails with `fail` once asked for a byte at or past `fail_at`.
adp::FillFn fill_from(const std::vector<uint8_t>& src, uint64_t fail_at = UINT64_MAX,
                      Status fail = Status::IoError("source gone")) {
  return [&src, fail_at, fail](uint8_t* dst, uint64_t off, size_t len) {
    if (off + len > fail_at) return fail;
    if (off + len > src.size()) return Status::InvalidArgument("fill past the source");
    std::memcpy(dst, src.data() + off, len);
    return Status::Ok();
  };
}

// Opens the card under test, a failure a CHECK ("<what>: <why>"): the store, or nullptr.
using Opener = std::function<std::unique_ptr<CardStore>(const std::string& what)>;

void failing_fill_fails_its_item_only(const std::string& card, const Opener& open) {
  const auto a = pattern(300 << 10, 1), b = pattern(2 << 20, 2), c = pattern((500 << 10) + 123, 3);
  {
    auto s = open(card + ": open");
    if (!s) return;
    IoContext ctx;
    // b's fill fails part way (1 MiB in, its fifth piece): part of it has landed.
    PutItem items[3] = {{"a", a.data(), a.size()},
                        {"b", nullptr, b.size(), fill_from(b, (1 << 20) + 4096)},
                        {"c", nullptr, c.size(), fill_from(c)}};
    Status res[3];
    s->put(ctx, items, 3, res, [] { return true; });
    check(res[0].ok(), card + ": the pointer item before the failing fill is stored: " + res[0].message());
    check(res[1].code() == Status::Code::kIoError && res[1].message() == "source gone",
          card + ": the failing fill's item answers the fill's status: " + res[1].message());
    check(res[2].ok(), card + ": the filled item after the failing one is stored: " + res[2].message());
    auto stats = s->stats();
    check(stats.objects == 2, card + ": two objects indexed, got " + std::to_string(stats.objects));
    // The fill's (the source's) failure, not the store's: its caller answers for it (review r9 S2).
    check(stats.store_failures == 0,
          card + ": a failed fill is no store failure, got " + std::to_string(stats.store_failures));
    check(stats.io_errors == 0 && stats.healthy, card + ": a failed fill is no card I/O error");
    check(stats.payload_bytes == a.size() + c.size(), card + ": only a's and c's payload is held");
    Status gs;
    check(!read_object(*s, "b", &gs) && gs.code() == Status::Code::kNotFound, card + ": the failed item is a miss");
    check(read_object(*s, "a") == a, card + ": a reads back");
    check(read_object(*s, "c") == c, card + ": c reads back");
    // Its first piece is on the card, but nothing of b is indexed or visible.
    check(!s->exists("b"), card + ": b does not exist");
  }
  auto s = open(card + ": reopen");
  if (!s) return;
  check(s->stats().recovered_objects == 2,
        card + ": a reopen recovers a and c, got " + std::to_string(s->stats().recovered_objects));
  check(!read_object(*s, "b"), card + ": b is a miss after a reopen");
  check(read_object(*s, "c") == c, card + ": c, stored after the failed fill, reads back after a reopen");
  check(read_object(*s, "a") == a, card + ": a reads back after a reopen");
}

void changing_source_reads_back_intact(const std::string& card, const Opener& open) {
  auto s = open(card + ": open");
  if (!s) return;
  IoContext ctx;
  for (size_t size : {size_t(3 << 20) + 777, size_t(9 << 20) + 5}) {
    std::vector<uint8_t> src = pattern(size, 7), delivered(size);
    // Each piece is copied from the source, then the whole source changes
    // (as a client scribbling on its buffer while the gateway reads it);
    // another thread changes it during the copies too.
    std::atomic<bool> stop{false};
    std::atomic<uint8_t> bump{1};
    PutItem item{"moving", nullptr, size, [&](uint8_t* dst, uint64_t off, size_t len) {
                   for (size_t i = 0; i < len; i++) dst[i] = src[off + i] + bump.load(std::memory_order_relaxed);
                   std::memcpy(delivered.data() + off, dst, len);
                   bump.fetch_add(1);
                   return Status::Ok();
                 }};
    std::thread scribbler([&] {
      while (!stop.load()) bump.fetch_add(3);
    });
    Status r;
    s->put(ctx, &item, 1, &r, [] { return true; });
    stop = true;
    scribbler.join();
    check(r.ok(), card + ": the store of a changing source succeeds: " + r.message());
    Status gs;
    auto got = read_object(*s, "moving", &gs);
    check(got.has_value(), card + ": the object of a changing source reads back intact (" + std::to_string(size) +
                               " bytes): " + gs.message());
    check(got == delivered, card + ": it holds the bytes the fill delivered (" + std::to_string(size) + " bytes)");
    check(s->stats().checksum_failures == 0, card + ": no checksum failure");
  }
  // A filled object larger than one staged piece, and one of no bytes.
  const auto big = pattern((9 << 20) + 4095, 9);
  PutItem items[2] = {{"big", nullptr, big.size(), fill_from(big)}, {"empty", nullptr, 0, fill_from(big)}};
  Status res[2];
  s->put(ctx, items, 2, res, [] { return true; });
  check(res[0].ok() && res[1].ok(), card + ": a 9 MiB and an empty filled object are stored");
  check(read_object(*s, "big") == big, card + ": the 9 MiB filled object reads back");
  check(read_object(*s, "empty") == std::vector<uint8_t>{}, card + ": the empty filled object reads back");
  // A fill that fails at once, in the last staged piece of a large object.
  PutItem bad[2] = {{"bad0", nullptr, big.size(), fill_from(big, 0)},
                    {"bad1", nullptr, big.size(), fill_from(big, big.size() - 1)}};
  s->put(ctx, bad, 2, res, [] { return true; });
  check(!res[0].ok() && !res[1].ok(), card + ": fills failing at the first and the last byte fail their items");
  check(!s->exists("bad0") && !s->exists("bad1"), card + ": neither is indexed");
  check(s->stats().io_errors == 0, card + ": no card I/O error counted");
}

// The card on a new fault device over `image` (blank: the first open formats it); *dev: the device.
std::unique_ptr<CardStore> open_fault(const std::shared_ptr<FaultImage>& image, const std::string& what,
                                      FaultDevice** dev = nullptr) {
  return adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes), what, dev);
}

// A power cut at each write of a filled store (a large one: several staged
// pieces, then the header), and a failed write at each.
void cut_and_fail_at_every_write() {
  const auto a = pattern(200 << 10, 4), f = pattern((9 << 20) + 100, 5);
  auto run = [&](FaultDevice* dev, CardStore& s, uint64_t* writes_of_fill) {
    IoContext ctx;
    PutItem ia{"acked", a.data(), a.size()};
    Status r;
    s.put(ctx, &ia, 1, &r, [] { return true; });
    check(r.ok(), "the store before the filled one is acknowledged");
    uint64_t before = dev->writes();
    PutItem item{"filled", nullptr, f.size(), fill_from(f)};
    s.put(ctx, &item, 1, &r, [] { return true; });
    if (writes_of_fill) *writes_of_fill = dev->writes() - before;
    return r;
  };
  uint64_t writes = 0;
  {
    FaultDevice* dev;
    auto s = open_fault(std::make_shared<FaultImage>(kCardBytes), "fault card opens", &dev);
    if (!s) return;
    check(run(dev, *s, &writes).ok(), "the filled store succeeds without faults");
  }
  check(writes >= 4, "a 9 MiB filled store takes several writes, got " + std::to_string(writes));
  for (uint64_t point = 0; point < writes; point++) {
    for (int mode = 0; mode < 2; mode++) {  // 0: power cut at the write, 1: the write fails
      auto image = std::make_shared<FaultImage>(kCardBytes);
      std::string what = (mode ? "failed write " : "power cut at write ") + std::to_string(point) + ": ";
      Status r;
      {
        FaultDevice* dev;
        auto s = open_fault(image, what + "fault card opens", &dev);
        if (!s) continue;
        // The store before it: its writes are counted from the first put.
        IoContext ctx;
        PutItem ia{"acked", a.data(), a.size()};
        s->put(ctx, &ia, 1, &r, [] { return true; });
        check(r.ok(), what + "the store before the filled one is acknowledged");
        // The card offset of the write that fails: a region header's (the frontier opening a region the store
        // continues into) makes the store go on in another region since session 33 (review33a F5).
        uint64_t failed_at = UINT64_MAX;
        if (mode == 0) {
          dev->cut_power_at_write(dev->writes() + point);
        } else {
          const uint64_t n = dev->writes() + point;
          dev->fail_write(n);
          dev->observe_writes([&failed_at, n](uint64_t i, uint64_t offset, uint64_t) {
            if (i == n) failed_at = offset;
          });
        }
        PutItem item{"filled", nullptr, f.size(), fill_from(f)};
        s->put(ctx, &item, 1, &r, [] { return true; });
        const bool region_header = failed_at != UINT64_MAX && failed_at >= adp::kDataOffset &&
                                   (failed_at - adp::kDataOffset) % kRegionBytes == 0;
        check(!r.ok() || region_header, what + "the filled store fails");
        if (mode == 1) {
          check(s->stats().io_errors >= 1, what + "counted as a card I/O error");
          if (r.ok())
            check(read_object(*s, "filled") == f, what +
                                                      "the filled object (its region header's write failed, "
                                                      "another region opened) reads back");
          else
            check(!read_object(*s, "filled"), what + "the filled object is a miss");
          check(read_object(*s, "acked") == a, what + "the earlier object reads back");
          dev->power_cut();
        }
      }
      auto s = open_fault(image, what + "reopen");
      if (!s) continue;
      check(read_object(*s, "acked") == a, what + "the acknowledged object survives");
      if (auto got = read_object(*s, "filled")) check(*got == f, what + "the filled object, if found, is byte-exact");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  if (!adp::testing::one_argument(argc, argv, "CARD_IMAGE", &path)) return 2;
  Opener image = [&](const std::string& what) {
    return adp::testing::checked_card(adp::testing::card_options(kRegionBytes, path, kCardBytes), what);
  };
  failing_fill_fails_its_item_only(path, image);
  if (auto s = image(path + ": open")) std::printf("card %s: mapped=%d\n", path.c_str(), s->memory_speed());
  std::remove(path.c_str());
  changing_source_reads_back_intact(path, image);
  std::remove(path.c_str());

  for (auto fn : {failing_fill_fails_its_item_only, changing_source_reads_back_intact}) {
    auto img = std::make_shared<FaultImage>(kCardBytes);
    fn("fault device", [img](const std::string& what) { return open_fault(img, what); });
  }
  cut_and_fail_at_every_write();
  return adp::testing::finish("fill_store_test");
}
