// SPDX-License-Identifier: Apache-2.0
// A disk store's copy and CRC off the write's path (session 37, brief aio37): CardStore::put_each submits item i's
// write (the device's writer: Linux AIO on a disk card), prepares item i+1 (its fill or copy, and its CRC) while
// that write is in flight, then waits for it and settles it as before. The device here (DeferredWriteDevice,
// testing/fault_device.h) holds each submitted write until its wait, so what the store did in between is seen.
// Checks, 256 KiB objects:
//   - filled objects: item i+1's fill (and CRC) runs before item i's write is waited for, for each i; every object
//     is acknowledged, loads back whole, and is on the card after a reopen; writes_overlapped counts K-1 of K;
//   - staged copies: item i+1's source changed when item i's write is waited for: the card holds the bytes it had
//     before (its copy and CRC were made while item i's write was held); zero-copy (4 KiB aligned) objects with a
//     tail: all acknowledged and whole; K-1 overlapped each;
//   - the write in flight fails: that item fails (an I/O error), is not indexed nor on the card after a reopen;
//     the item prepared meanwhile, and the later ones, are stored;
//   - the next item's fill throws while a write is in flight: the exception leaves put_each only after that write
//     was waited for (no write of the caller's memory after put returns, its ticket resolved: a later put does not
//     wait for it), nothing of the put indexed nor on the card after a reopen; a later put is stored; a
//     std::bad_alloc from a fill fails that item only (out of memory), the rest are stored;
//   - the next item is refused (an empty key) or its source fails, while a write is in flight: the items around it
//     are stored, the write in flight waited for once, settled as usual.
//
//   - on a card image (the argument, if given): Linux AIO on a disk, every kind of store (staged, zero-copy,
//     filled, a large zero-copy one not overlapped, objects spanning two regions), all whole after a reopen; with
//     ADP_CARD_AIO=0 the same through the synchronous writer (a failed io_setup's fallback), none overlapped.
//
//   write_ahead_test [CARD_IMAGE]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::IoContext;
using adp::PutItem;
using adp::Status;
using adp::testing::check;
using adp::testing::DeferredWriteDevice;
using adp::testing::FaultImage;

constexpr uint64_t kRegionBytes = 4ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(8, kRegionBytes);
constexpr size_t kObject = 256u << 10;
constexpr int kItems = 4;

std::string key(const std::string& what, int i) { return "m@0@0@" + what + std::to_string(i); }

std::unique_ptr<adp::CardStore> open_card(const std::shared_ptr<FaultImage>& image, const std::string& what,
                                          DeferredWriteDevice** dev = nullptr) {
  return adp::testing::checked_fault_card<DeferredWriteDevice>(image, adp::testing::card_options(kRegionBytes), what,
                                                               dev);
}

// Puts items (put_each, all wanted); results.
std::vector<Status> put_all(adp::CardStore& s, IoContext& ctx, const std::vector<PutItem>& items) {
  std::vector<Status> r(items.size());
  s.put_each(ctx, items.data(), items.size(), r.data(), [](size_t) { return true; });
  return r;
}

void check_loads(adp::CardStore& s, const std::string& what, const std::vector<std::string>& keys,
                 const std::vector<std::vector<uint8_t>>& values, const std::vector<bool>& present) {
  for (size_t i = 0; i < keys.size(); i++) {
    Status st;
    auto got = adp::testing::read_object(s, keys[i], &st);
    if (present[i])
      check(got && *got == values[i],
            what + ": item " + std::to_string(i) + " loads back whole (" + st.message() + ")");
    else
      check(!got && !s.exists(keys[i]), what + ": item " + std::to_string(i) + " is not stored");
  }
}

// A put of kItems filled objects of kObject bytes on a new card: the log of fills (the item, at its first piece)
// and of waits ("w"), in order.
struct FilledPut {
  std::shared_ptr<FaultImage> image = std::make_shared<FaultImage>(kCardBytes);
  DeferredWriteDevice* dev = nullptr;
  std::unique_ptr<adp::CardStore> s;
  std::string log;
  int waits = 0;
  std::function<void(int wait)> at_wait;  // after the wait's entry in the log, before its write is applied
  std::function<Status(int item)> source = [](int) { return Status::Ok(); };  // not Ok (or a throw): its fill fails
  std::vector<std::vector<uint8_t>> values;
  std::vector<std::string> keys;
  std::vector<PutItem> items;
  IoContext ctx;

  FilledPut(const std::string& what, const std::string& prefix, int seed) {
    s = open_card(image, what + ": open", &dev);
    if (!s) return;
    dev->on_wait([this](uint64_t) {
      log += "w ";
      if (at_wait) at_wait(++waits);
    });
    for (int i = 0; i < kItems; i++) {
      values.push_back(adp::testing::pattern(kObject, uint8_t(seed + i)));
      keys.push_back(key(prefix, i));
    }
    for (int i = 0; i < kItems; i++)
      items.push_back({keys[i], nullptr, kObject, [this, i](uint8_t* dst, uint64_t off, size_t len) {
                         if (off == 0) log += std::to_string(i) + " ";
                         if (Status st = source(i); !st.ok()) return st;
                         std::memcpy(dst, values[i].data() + off, len);
                         return Status::Ok();
                       }});
  }
  std::vector<Status> put() { return put_all(*s, ctx, items); }
  // The store closed and the card opened again (a new device over the image).
  void reopen(const std::string& what) {
    s.reset();
    s = open_card(image, what + ": reopen");
  }
};

void filled() {
  const std::string what = "filled";
  FilledPut p(what, "f", 1);
  if (!p.s) return;
  auto r = p.put();
  for (int i = 0; i < kItems; i++) check(r[i].ok(), what + ": item " + std::to_string(i) + ": " + r[i].message());
  // Item i+1 filled before item i's write was waited for: "0 1 w 2 w 3 w w" (synchronous writes: "0 w 1 w ..").
  check(p.log == "0 1 w 2 w 3 w w ",
        what + ": each next item filled while the write before it was held (log: " + p.log + ")");
  check(p.s->stats().writes_overlapped == kItems - 1,
        what + ": writes_overlapped " + std::to_string(p.s->stats().writes_overlapped) + ", expected 3");
  check_loads(*p.s, what, p.keys, p.values, {true, true, true, true});
  p.reopen(what);
  if (p.s) check_loads(*p.s, what + " after a reopen", p.keys, p.values, {true, true, true, true});
}

// Objects from memory: staged copies (not 4 KiB aligned), or zero-copy (aligned, a tail block).
void from_memory(bool aligned) {
  const std::string what = aligned ? "zero-copy" : "staged";
  auto image = std::make_shared<FaultImage>(kCardBytes);
  DeferredWriteDevice* dev;
  auto s = open_card(image, what + ": open", &dev);
  if (!s) return;
  const size_t size = aligned ? kObject + 100 : kObject;
  const size_t stride = 2 * kObject;  // each object's room in the buffer
  uint8_t* mem = static_cast<uint8_t*>(std::aligned_alloc(4096, stride * kItems));
  std::vector<std::vector<uint8_t>> values;
  std::vector<std::string> keys;
  std::vector<PutItem> items;
  for (int i = 0; i < kItems; i++) keys.push_back(key(what, i));
  for (int i = 0; i < kItems; i++) {
    values.push_back(adp::testing::pattern(size, uint8_t(i + 11)));
    uint8_t* at = mem + i * stride + (aligned ? 0 : 8);
    std::memcpy(at, values[i].data(), size);
    items.push_back({keys[i], at, size});
  }
  int waits = 0;
  if (!aligned)  // item i+1's source changed as item i's write is waited for: its staged copy was made before
    dev->on_wait([&](uint64_t) {
      if (++waits < kItems) std::memset(const_cast<uint8_t*>(items[waits].data), 0xee, size);
    });
  IoContext ctx;
  auto r = put_all(*s, ctx, items);
  for (int i = 0; i < kItems; i++) check(r[i].ok(), what + ": item " + std::to_string(i) + ": " + r[i].message());
  check(s->stats().writes_overlapped == kItems - 1,
        what + ": writes_overlapped " + std::to_string(s->stats().writes_overlapped) + ", expected 3");
  check_loads(*s, what, keys, values, {true, true, true, true});
  s.reset();
  s = open_card(image, what + ": reopen");
  if (s) check_loads(*s, what + " after a reopen", keys, values, {true, true, true, true});
  std::free(mem);
}

// The second item's write (in flight while the third is filled) fails.
void write_fails() {
  const std::string what = "the write in flight fails";
  FilledPut p(what, "x", 21);
  if (!p.s) return;
  p.at_wait = [&p](int wait) {
    if (wait == 2) p.dev->fail_write(p.dev->writes());  // item 1's
  };
  const uint64_t failures = p.s->stats().store_failures;
  auto r = p.put();
  check(r[0].ok() && r[2].ok() && r[3].ok(),
        what + ": items 0, 2, 3 stored (" + r[0].message() + r[2].message() + r[3].message() + ")");
  check(!r[1].ok() && r[1].code() == Status::Code::kIoError, what + ": item 1 failed (" + r[1].message() + ")");
  check(p.log == "0 1 w 2 w 3 w w ", what + ": item 2 filled while item 1's write was held (log: " + p.log + ")");
  check(p.s->stats().store_failures == failures + 1, what + ": one store failure counted");
  check(p.dev->submitted() == p.dev->waited(), what + ": every write submitted was waited for");
  check_loads(*p.s, what, p.keys, p.values, {true, false, true, true});
  p.reopen(what);
  if (p.s) check_loads(*p.s, what + " after a reopen", p.keys, p.values, {true, false, true, true});
}

struct SourceGone {};

// Item 2's fill throws (SourceGone) while item 1's write is in flight; then std::bad_alloc instead.
void fill_throws() {
  const std::string what = "the next fill throws";
  FilledPut p(what, "t", 31);
  if (!p.s) return;
  bool bad_alloc = false;
  p.source = [&bad_alloc](int i) {
    if (i != 2) return Status::Ok();
    if (bad_alloc) throw std::bad_alloc();
    throw SourceGone{};
  };
  bool thrown = false;
  uint64_t waited_at_throw = 0;
  try {
    p.put();
  } catch (const SourceGone&) {
    thrown = true;
    waited_at_throw = p.dev->waited();
  }
  check(thrown, what + ": the fill's exception leaves put_each");
  check(p.log == "0 1 w 2 w ", what + ": item 2 filled while item 1's write was held (log: " + p.log + ")");
  check(waited_at_throw == p.dev->submitted(),
        what + ": every write submitted was waited for before the exception left put_each (" +
            std::to_string(waited_at_throw) + " of " + std::to_string(p.dev->submitted()) + ")");
  if (waited_at_throw != p.dev->submitted()) return;  // a later put would wait for the unresolved ticket for ever
  for (int i = 0; i < kItems; i++)
    check(!p.s->exists(p.keys[i]), what + ": item " + std::to_string(i) + " is not indexed");
  const auto later = adp::testing::pattern(kObject, 99);
  check(adp::testing::put_one(*p.s, p.ctx, key("later", 0), later).ok(), what + ": a later put is stored");
  // std::bad_alloc from item 2's fill: that item fails (out of memory), the others are stored.
  bad_alloc = true;
  const std::vector<std::string> thrown_keys = p.keys;
  for (int i = 0; i < kItems; i++) p.keys[i] = key("b", i);
  for (int i = 0; i < kItems; i++) p.items[i].key = p.keys[i];
  auto r = p.put();
  check(r[0].ok() && r[1].ok() && r[3].ok(), what + " (std::bad_alloc): items 0, 1, 3 stored");
  check(!r[2].ok() && r[2].io_class() == Status::IoClass::kGatewayMemory,
        what + " (std::bad_alloc): item 2 failed for want of memory (" + r[2].message() + ")");
  check_loads(*p.s, what + " (std::bad_alloc)", p.keys, p.values, {true, true, false, true});
  p.reopen(what);
  if (!p.s) return;
  for (int i = 0; i < kItems; i++)
    check(!p.s->exists(thrown_keys[i]), what + " after a reopen: item " + std::to_string(i) + " of the thrown put");
  check(adp::testing::read_object(*p.s, key("later", 0)) == later, what + " after a reopen: the later put's object");
  check_loads(*p.s, what + " (std::bad_alloc) after a reopen", p.keys, p.values, {true, true, false, true});
}

// Item 1 refused (an empty key) and item 3's source failing, each while item 0's, then item 2's, write is in flight.
void next_refused() {
  const std::string what = "the next item refused";
  FilledPut p(what, "r", 41);
  if (!p.s) return;
  p.keys[1].clear();
  p.items[1].key = p.keys[1];
  p.source = [](int i) { return i == 3 ? Status::IoError("the source is gone") : Status::Ok(); };
  auto r = p.put();
  check(r[0].ok() && r[2].ok(), what + ": items 0 and 2 stored (" + r[0].message() + r[2].message() + ")");
  check(r[1].code() == Status::Code::kInvalidArgument, what + ": item 1 refused (" + r[1].message() + ")");
  check(!r[3].ok() && r[3].message() == "the source is gone", what + ": item 3 failed by its source");
  check(p.log == "0 2 w 3 w ",
        what + ": item 2 filled while item 0's write was held, 3 while 2's (log: " + p.log + ")");
  check(p.dev->submitted() == 2 && p.dev->waited() == 2, what + ": two writes submitted, each waited for once");
  check(p.s->stats().writes_overlapped == 1,
        what + ": writes_overlapped " + std::to_string(p.s->stats().writes_overlapped) + ", expected 1");
  const std::vector<std::string> keys = {p.keys[0], p.keys[2], p.keys[3]};
  const std::vector<std::vector<uint8_t>> values = {p.values[0], p.values[2], p.values[3]};
  check_loads(*p.s, what, keys, values, {true, true, false});
  p.reopen(what);
  if (p.s) check_loads(*p.s, what + " after a reopen", keys, values, {true, true, false});
}

// A card image at `path` (CardDevice: Linux AIO on a disk, synchronous on tmpfs): three puts of eight objects of each
// kind (staged, zero-copy with a tail, filled, and one zero-copy of 1.5 MiB, written body then header: not
// overlapped), some spanning two regions; all stored, whole, and after a reopen.
void on_card(const std::string& path) {
  const std::string what = "card " + path;
  std::remove(path.c_str());
  auto s = adp::testing::checked_card(adp::testing::card_options(kRegionBytes, path, kCardBytes), what + ": open");
  if (!s) return;
  const bool disk = !s->memory_speed();
  std::printf("%s: %s\n", what.c_str(), disk ? "disk" : "memory-backed");
  constexpr size_t kLarge = 1536u << 10;
  uint8_t* mem = static_cast<uint8_t*>(std::aligned_alloc(4096, 8 * (2u << 20)));
  std::vector<std::vector<uint8_t>> values;
  std::vector<std::string> keys;
  IoContext ctx;
  for (int p = 0; p < 3; p++) {
    std::vector<PutItem> items;
    const size_t first = values.size();
    for (int i = 0; i < 8; i++) {
      const int kind = i % 4;  // staged, zero-copy, filled, then a large zero-copy one for i == 3 only
      const size_t size = kind == 1 ? kObject + 100 : i == 3 ? kLarge : kObject;
      values.push_back(adp::testing::pattern(size, uint8_t(50 + first + i)));
      keys.push_back(key("c", int(first) + i));
    }
    for (int i = 0; i < 8; i++) {
      const std::vector<uint8_t>& v = values[first + i];
      uint8_t* at = mem + i * (2u << 20) + (i % 4 == 0 ? 8 : 0);
      std::memcpy(at, v.data(), v.size());
      if (i % 4 == 2)
        items.push_back({keys[first + i], nullptr, v.size(), [&v](uint8_t* dst, uint64_t off, size_t len) {
                           std::memcpy(dst, v.data() + off, len);
                           return Status::Ok();
                         }});
      else
        items.push_back({keys[first + i], at, v.size()});
    }
    auto r = put_all(*s, ctx, items);
    for (int i = 0; i < 8; i++)
      check(r[i].ok(), what + ": put " + std::to_string(p) + " item " + std::to_string(i) + ": " + r[i].message());
  }
  const uint64_t overlapped = s->stats().writes_overlapped;
  std::printf("%s: writes_overlapped %llu of %zu stores\n", what.c_str(), static_cast<unsigned long long>(overlapped),
              values.size());
  // Of each put's eight: items 1, 2 (after 0, 1) and 5, 6, 7 (after 4, 5, 6); fewer where an object spans two
  // regions (written now, in order, not in flight).
  // WRITE_AHEAD_TEST_SYNC=1: the test's io_setup is refused (test_write_ahead.py preloads a shim): the fallback.
  const char* aio = std::getenv("ADP_CARD_AIO");
  const char* refused = std::getenv("WRITE_AHEAD_TEST_SYNC");
  const bool sync = (aio && std::string(aio) == "0") || (refused && std::string(refused) == "1");
  if (disk && !sync)
    check(overlapped >= 9 && overlapped <= 15, what + ": writes_overlapped " + std::to_string(overlapped));
  else  // memory-backed, AIO turned off or io_setup refused (the synchronous writer)
    check(overlapped == 0, what + ": " + (disk ? "synchronous writer" : "memory-backed") + ", nothing overlapped");
  std::vector<bool> all(values.size(), true);
  check_loads(*s, what, keys, values, all);
  s.reset();
  s = adp::testing::checked_card(adp::testing::card_options(kRegionBytes, path), what + ": reopen");
  if (s) check_loads(*s, what + " after a reopen", keys, values, all);
  s.reset();
  std::free(mem);
  std::remove(path.c_str());
}

}  // namespace

// Without an argument: on the DeferredWriteDevice; with one, also on a card image at that path.
int main(int argc, char** argv) {
  filled();
  from_memory(false);
  from_memory(true);
  write_fails();
  fill_throws();
  next_refused();
  if (argc > 1) on_card(argv[1]);
  return adp::testing::finish("write_ahead_test");
}
