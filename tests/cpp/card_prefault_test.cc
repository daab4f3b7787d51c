// SPDX-License-Identifier: Apache-2.0
// The background prefault of a tmpfs card's mapping (CardDevice::
// start_prefault): after open, the mapping's present pages (/proc/self/
// pagemap) are exactly the image's written extents, and the image's allocated
// blocks did not grow (no page allocated for a hole); stopping it, or
// closing the card while it runs, stops it part-way and cleanly (this test
// also runs under ASan and TSan); a store in flight holds it off (it makes
// no piece until the store is done, then goes on to the end), and a stop
// while it waits so is prompt; a card on disk, or with ADP_CARD_PREFAULT=0,
// starts no thread.
//
//   card_prefault_test <tmpfs dir> <disk dir>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "page_state.h"
#include "store/card_device.h"
#include "store/card_store.h"

namespace {

using adp::CardDevice;
using adp::testing::allocated_bytes;
// A sparse image holding the given extents, written before any CardDevice opens it (as another process would have).
using adp::testing::make_sparse_file;
using adp::testing::present_pages;

constexpr uint64_t kPage = 4096, kMiB = 1 << 20;

int prefault_threads() { return adp::testing::threads_named("adp-prefault"); }

bool wait_done(const CardDevice& dev) {
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!dev.prefault_done() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return dev.prefault_done();
}

// After open, the written extents (one of them not page-sized at its end
// within the file: tmpfs counts whole pages) are mapped, holes are not, and
// nothing was allocated.
void maps_the_written_extents(const std::string& dir) {
  const std::string path = dir + "/prefault-extents.img";
  const uint64_t size = 256 * kMiB;
  const std::vector<std::pair<uint64_t, uint64_t>> extents = {
      {0, kPage}, {4 * kMiB, 20 * kMiB}, {100 * kMiB, kMiB + 3 * kPage + 100}, {200 * kMiB, 40 * kMiB}};
  make_sparse_file(path, size, extents);
  const uint64_t allocated = allocated_bytes(path);
  std::unique_ptr<CardDevice> dev;
  adp::Status s = CardDevice::Open(path, 0, &dev);
  CHECK(s.ok() && dev->mapped(), "open %s mapped: %s", path.c_str(), s.message().c_str());
  if (!s.ok() || !dev->mapped()) return;
  std::vector<bool> before = present_pages(dev->mapped(), size);
  size_t present_before = 0;
  for (bool b : before) present_before += b;
  CHECK(present_before == 0, "%zu pages present before the prefault", present_before);
  dev->start_prefault();
  CHECK(wait_done(*dev), "the prefault did not finish");
  const adp::testing::PageDiff d = adp::testing::page_diff(present_pages(dev->mapped(), size), extents);
  CHECK(d.missing == 0, "%zu pages of written extents not mapped", d.missing);
  CHECK(d.extra == 0, "%zu pages of holes mapped", d.extra);
  CHECK(allocated_bytes(path) == allocated, "the image's allocated bytes grew from %llu to %llu",
        static_cast<unsigned long long>(allocated), static_cast<unsigned long long>(allocated_bytes(path)));
  // The mapped pages are the card's bytes.
  CHECK(dev->mapped()[4 * kMiB] == 0x5a && dev->mapped()[240 * kMiB - 1] == 0x5a, "mapped bytes");
  dev.reset();
  CHECK(adp::testing::threads_named_after_join("adp-prefault") == 0, "a prefault thread outlived its card");
  ::unlink(path.c_str());
}

// Stopped at once after it started, over 512 MiB of extents: it stops
// part-way (within a step), and the destructor, which stops it the same way
// before unmapping, is clean while it runs (ASan, TSan).
void stops_when_asked_and_on_close(const std::string& dir) {
  const std::string path = dir + "/prefault-close.img";
  const uint64_t written = 512 * kMiB;
  make_sparse_file(path, 640 * kMiB, {{0, written}});
  const uint64_t allocated = allocated_bytes(path);
  std::unique_ptr<CardDevice> dev;
  adp::Status s = CardDevice::Open(path, 0, &dev);
  CHECK(s.ok() && dev->mapped(), "open %s mapped: %s", path.c_str(), s.message().c_str());
  if (!s.ok() || !dev->mapped()) return;
  dev->start_prefault();
  dev->start_prefault();  // a second call starts nothing
  dev->stop_prefault();
  size_t present = 0;
  for (bool b : present_pages(dev->mapped(), written)) present += b;
  CHECK(present < written / kPage && !dev->prefault_done(), "the prefault ran to the end (%zu of %llu pages)", present,
        static_cast<unsigned long long>(written / kPage));
  CHECK(adp::testing::threads_named_after_join("adp-prefault") == 0, "the prefault thread outlived stop_prefault()");
  dev->start_prefault();  // stopped for good: starts nothing
  CHECK(adp::testing::threads_named_after_join("adp-prefault") == 0, "a stopped prefault started again");
  dev.reset();
  // Closed while it runs.
  s = CardDevice::Open(path, 0, &dev);
  CHECK(s.ok(), "reopen: %s", s.message().c_str());
  if (!s.ok()) return;
  dev->start_prefault();
  dev.reset();
  CHECK(adp::testing::threads_named_after_join("adp-prefault") == 0, "a prefault thread outlived its card");
  CHECK(allocated_bytes(path) == allocated, "the image's allocated bytes changed");
  // Reopened and left alone, it runs to the end.
  s = CardDevice::Open(path, 0, &dev);
  CHECK(s.ok(), "reopen: %s", s.message().c_str());
  if (!s.ok()) return;
  dev->start_prefault();
  CHECK(wait_done(*dev), "the prefault did not finish after a reopen");
  dev.reset();
  ::unlink(path.c_str());
}

// The written extents of the file at path within [0, n), as SEEK_DATA and SEEK_HOLE find them.
std::vector<std::pair<uint64_t, uint64_t>> written_extents(const std::string& path, uint64_t n) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  for (off_t at = 0; static_cast<uint64_t>(at) < n;) {
    const off_t data = ::lseek(fd, at, SEEK_DATA);
    if (data < 0 || static_cast<uint64_t>(data) >= n) break;
    const off_t hole = ::lseek(fd, data, SEEK_HOLE);
    const uint64_t end = std::min<uint64_t>(static_cast<uint64_t>(hole), n);
    out.emplace_back(static_cast<uint64_t>(data), end - static_cast<uint64_t>(data));
    at = static_cast<off_t>(end);
  }
  ::close(fd);
  return out;
}

size_t present_count(const uint8_t* p, uint64_t n) {
  size_t c = 0;
  for (bool b : present_pages(p, n)) c += b;
  return c;
}

// A store in flight holds the prefault off (CardDevice::begin_foreground,
// from CardStore's put): with its fill held, the prefault started meanwhile
// maps nothing (the yield set to 60 s here: 20 ms otherwise, after which it
// makes a piece all the same); once the store is done it maps every written
// page. A stop while it so waits is prompt.
void waits_for_a_store_in_flight(const std::string& dir) {
  const std::string path = dir + "/prefault-store.img";
  ::unlink(path.c_str());
  const uint64_t look = 128 * kMiB;  // within the objects stored first (80 of 2 MiB from the card's start)
  {
    adp::CardOptions o;
    o.path = path;
    o.create_bytes = 256 * kMiB;
    o.durable = false;
    std::unique_ptr<adp::CardStore> s;
    adp::Status st = adp::CardStore::Open(o, &s);
    CHECK(st.ok(), "create %s: %s", path.c_str(), st.message().c_str());
    if (!st.ok()) return;
    adp::IoContext ctx;
    std::vector<uint8_t> v(2 * kMiB, 0x33);
    for (int i = 0; i < 80; i++) {
      const std::string key = "o" + std::to_string(i);
      adp::PutItem it{key, v.data(), v.size()};
      s->put(ctx, &it, 1, &st, [] { return true; });
      CHECK(st.ok(), "put %s: %s", key.c_str(), st.message().c_str());
    }
  }
  adp::set_card_prefault_yield_for_test(std::chrono::seconds(60));
  std::unique_ptr<CardDevice> dev;
  adp::Status s = CardDevice::Open(path, 0, &dev);
  CHECK(s.ok() && dev->mapped(), "open %s mapped: %s", path.c_str(), s.message().c_str());
  if (!s.ok() || !dev->mapped()) return;
  CardDevice* card = dev.get();
  adp::CardOptions o;
  o.path = path;
  o.durable = false;
  std::unique_ptr<adp::CardStore> store;
  s = adp::CardStore::OpenDevice(std::move(dev), o, &store);  // starts no prefault (CardStore::Open does)
  CHECK(s.ok(), "open the store: %s", s.message().c_str());
  if (!s.ok()) return;
  CHECK(present_count(card->mapped(), look) == 0, "pages present before the prefault");
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  adp::Status put_status = adp::Status::IoError("not run");
  std::thread putter([&] {
    adp::IoContext ctx;
    bool first = true;
    adp::PutItem it{"held", nullptr, 2 * kMiB, [&](uint8_t* dst, uint64_t, size_t len) {
                      if (first) {
                        first = false;
                        entered.set_value();
                        released.wait();
                      }
                      std::memset(dst, 7, len);
                      return adp::Status::Ok();
                    }};
    store->put(ctx, &it, 1, &put_status, [] { return true; });
  });
  entered.get_future().wait();  // the store is in flight, its fill held
  card->start_prefault();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const size_t during = present_count(card->mapped(), look);
  CHECK(during == 0, "the prefault mapped %zu pages (of %llu) while a store was in flight", during,
        static_cast<unsigned long long>(look / kPage));
  release.set_value();
  putter.join();
  CHECK(put_status.ok(), "the held store: %s", put_status.message().c_str());
  CHECK(wait_done(*card), "the prefault did not finish once the store was done");
  const adp::testing::PageDiff d =
      adp::testing::page_diff(present_pages(card->mapped(), look), written_extents(path, look));
  CHECK(d.missing == 0 && d.extra == 0, "after the store: %zu pages of written extents not mapped, %zu of holes mapped",
        d.missing, d.extra);
  store.reset();
  // Stopped (the card closed) while it waits for an operation in flight: at
  // once, not after the yield. The operation ends after the device is freed
  // (a gateway's load left behind by its stop): it touches nothing of it
  // (ASan: tests/sanitizers' entry of this program).
  s = CardDevice::Open(path, 0, &dev);
  CHECK(s.ok(), "reopen: %s", s.message().c_str());
  if (s.ok()) {
    const adp::Foreground op = dev->begin_foreground();  // ends at this block's end, after the close
    dev->start_prefault();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t0 = std::chrono::steady_clock::now();
    dev.reset();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(waited < 10, "the close waited %.1f s for a prefault holding off (its yield is 60 s)", waited);
  }
  adp::set_card_prefault_yield_for_test(std::chrono::milliseconds(20));
  ::unlink(path.c_str());
}

// A card on disk is not mapped: no thread.
void no_thread_for_a_disk_card(const std::string& dir) {
  const std::string path = dir + "/prefault-disk.img";
  make_sparse_file(path, 16 * kMiB, {{0, kMiB}});
  std::unique_ptr<CardDevice> dev;
  adp::Status s = CardDevice::Open(path, 0, &dev);
  CHECK(s.ok(), "open %s: %s", path.c_str(), s.message().c_str());
  if (!s.ok()) return;
  CHECK(!dev->memory_backed() && !dev->mapped(), "%s is not a disk card", path.c_str());
  dev->start_prefault();
  CHECK(prefault_threads() == 0 && !dev->prefault_done(), "a disk card started a prefault");
  dev.reset();
  ::unlink(path.c_str());
}

// ADP_CARD_PREFAULT=0 turns it off.
void off_by_environment(const std::string& dir) {
  const std::string path = dir + "/prefault-off.img";
  make_sparse_file(path, 16 * kMiB, {{0, kMiB}});
  ::setenv("ADP_CARD_PREFAULT", "0", 1);
  std::unique_ptr<CardDevice> dev;
  adp::Status s = CardDevice::Open(path, 0, &dev);
  CHECK(s.ok() && dev->mapped(), "open %s mapped: %s", path.c_str(), s.message().c_str());
  if (s.ok()) {
    dev->start_prefault();
    CHECK(prefault_threads() == 0 && !dev->prefault_done(), "ADP_CARD_PREFAULT=0 started a prefault");
  }
  ::unsetenv("ADP_CARD_PREFAULT");
  dev.reset();
  ::unlink(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TMPFS_DIR DISK_DIR\n", argv[0]);
    return 2;
  }
  maps_the_written_extents(argv[1]);
  stops_when_asked_and_on_close(argv[1]);
  waits_for_a_store_in_flight(argv[1]);
  no_thread_for_a_disk_card(argv[2]);
  off_by_environment(argv[1]);
  return adp::testing::finish("card_prefault_test");
}
