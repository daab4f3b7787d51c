// SPDX-License-Identifier: Apache-2.0
// Loads from a disk card (ReadInto::kPieces: an object larger than 4 MiB
// read straight into LMCache's buffer in pieces of 32 MiB, the embedded
// backend's, the header block in the same request as the first (and the
// tail block with the last), each under the batch's guard and before its
// deadline; each piece's CRC but the last's computed on the worker's
// CrcWorker while the next is read; one of 4 MiB or less staged, then
// copied under the guard), on a FaultDevice whose reads are slow (64 MiB/s,
// the bytes land when a read ends, as a DMA's would). Checks, for a 64 MiB
// object and a 4 MiB one (staged):
//   - a timely load of the large object reads 32 MiB + 4 KiB (header block
//     and first piece), then 32 MiB: a request per 32 MiB, no header read
//     alone;
//   - a load past its deadline completes as failed, and nothing is written
//     into its buffer after that (4 KiB aligned buffer; for 64 MiB also an
//     unaligned one: staged, then copied under the guard), and the load in
//     pieces stops reading once it is late instead of reading the rest;
//   - with a deadline it can meet, the same loads return the object's bytes;
//   - a damaged byte (in the large object's first piece, checked on the
//     CrcWorker, or in its last piece, checked on the worker; in the small
//     one) makes it a miss, counted, and the object is dropped;
//   - an object deleted while its first request is read: the 4 MiB one
//     (staged) is a miss whose buffer is left untouched (its header, read in
//     the same request, is checked before any byte is copied into the
//     buffer); the 64 MiB one (its header read with its payload into the
//     buffer) is a hit with the object's bytes: the delete's tombstone waits
//     for the read, the get is ordered before the delete.
// The Connector over the embedded backend, one worker.
//
//   disk_load_test
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "connector/connector.h"
#include "store/card_store.h"
#include "test_card.h"
#include "test_connector.h"
#include "testing/fault_device.h"
#include "util/aligned_buffer.h"

namespace {

using adp::Completion;
using adp::OpType;

constexpr uint64_t kCardBytes = 576ull << 20;   // 8 regions
constexpr uint64_t kRegionBytes = 68ull << 20;  // a 64 MiB object fits in one: one read a piece
constexpr size_t kObjectBytes = 64u << 20;      // read as 32 MiB + 4 KiB, then 32 MiB (embedded_backend.cc)
constexpr int kObjectReads = 2;                 // those reads
constexpr size_t kSmallBytes = 4u << 20;        // one piece: staged
const char* const kKey = "m@00000000@0@large";

using adp::testing::check;
using adp::testing::embedded_connector;
using adp::testing::run;
using adp::testing::wait_for;

// Reads take 1 s per 64 MiB while slow; the data lands when the read ends.
class SlowDevice : public adp::testing::FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  adp::Status readv(uint64_t offset, const iovec* iov, int count) const override {
    if (slow.load()) {
      uint64_t n = 0;
      for (int i = 0; i < count; i++) n += iov[i].iov_len;
      reads_started++;
      {
        std::lock_guard<std::mutex> lock(mu);
        sizes.push_back(n);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(n / 64));  // 64 MiB/s: ~16 us per KiB
      payload_reads++;
    }
    return FaultDevice::readv(offset, iov, count);
  }
  std::atomic<bool> slow{false};
  mutable std::atomic<int> payload_reads{0};
  mutable std::atomic<int> reads_started{0};
  mutable std::mutex mu;
  mutable std::vector<uint64_t> sizes;  // of the slow reads, in the order they started
};

// A load's destination: `bytes` of 0x5a at `offset` into an aligned buffer; `what` names it in the checks.
struct Destination {
  Destination(size_t bytes, size_t offset)
      : what(std::to_string(bytes >> 20) + " MiB, " + (offset ? "unaligned buffer: " : "aligned buffer: ")) {
    mem.reserve(bytes + offset);
    dst = mem.data() + offset;
    std::memset(dst, 0x5a, bytes);
  }
  const std::string what;
  adp::AlignedBuffer mem;
  uint8_t* dst;
};

// A load of `key` (`bytes`) into dst (offset bytes into an aligned buffer)
// past a deadline of timeout_ms, shorter than the object's read.
void late_load(std::shared_ptr<adp::CardStore> store, SlowDevice* dev, const std::string& key, size_t bytes,
               size_t offset, int timeout_ms) {
  Destination to(bytes, offset);
  uint8_t* const dst = to.dst;
  const std::string& what = to.what;
  auto c = embedded_connector(store, 1, timeout_ms);
  dev->payload_reads = 0;
  dev->slow = true;
  Completion got = run(*c, OpType::kGet, {key}, {{dst, bytes}});
  std::vector<uint8_t> at_completion(dst, dst + bytes);
  // Reading the whole 64 MiB object takes 1 s: wait that long again, so
  // that a load that went on would have written by now.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  check(!got.ok && got.error.find("timed out") != std::string::npos,
        what + "a load past its deadline fails as timed out: '" + got.error + "'");
  check(got.per_key == std::vector<uint8_t>{0}, what + "the late key is a miss");
  check(std::memcmp(at_completion.data(), dst, bytes) == 0,
        what + "nothing was written into the buffer after its future completed");
  if (!offset && bytes > kSmallBytes)
    check(dev->payload_reads.load() < kObjectReads, what + "the load stopped reading once late (" +
                                                        std::to_string(dev->payload_reads.load()) + " reads of " +
                                                        std::to_string(kObjectReads) + ")");
  c->close();
  dev->slow = false;
}

// The same load with a deadline it meets.
void timely_load(std::shared_ptr<adp::CardStore> store, SlowDevice* dev, const std::string& key, size_t offset,
                 const std::vector<uint8_t>& want) {
  const size_t bytes = want.size();
  Destination to(bytes, offset);
  uint8_t* const dst = to.dst;
  const std::string& what = to.what;
  auto c = embedded_connector(store, 1, 30000);
  dev->payload_reads = 0;
  {
    std::lock_guard<std::mutex> lock(dev->mu);
    dev->sizes.clear();
  }
  dev->slow = true;
  Completion got = run(*c, OpType::kGet, {key}, {{dst, bytes}});
  dev->slow = false;
  check(got.ok && got.per_key == std::vector<uint8_t>{1}, what + "a slow load within its deadline hits: " + got.error);
  check(std::memcmp(dst, want.data(), bytes) == 0, what + "the loaded bytes are the object's");
  if (!offset && bytes > kSmallBytes) {
    std::lock_guard<std::mutex> lock(dev->mu);
    const std::vector<uint64_t> want_sizes{(32u << 20) + 4096, 32u << 20};
    std::string got_sizes;
    for (uint64_t n : dev->sizes) got_sizes += " " + std::to_string(n >> 10) + " KiB";
    check(dev->sizes == want_sizes,
          what + "the header block with the first 32 MiB, then 32 MiB (read:" + got_sizes + ")");
  }
  c->close();
}

// Stores `bytes` of a pattern under key; returns them.
std::vector<uint8_t> store_object(std::shared_ptr<adp::CardStore> store, const std::string& key, size_t bytes) {
  adp::AlignedBuffer src;
  src.reserve(bytes);
  for (size_t i = 0; i < bytes; i++) src.data()[i] = static_cast<uint8_t>(i * 131 + (i >> 20) + key.size());
  auto c = embedded_connector(store, 1, 30000);
  Completion put = run(*c, OpType::kSet, {key}, {{src.data(), bytes}});
  check(put.ok, "the store of " + key + " succeeds: " + put.error);
  c->close();
  return std::vector<uint8_t>(src.data(), src.data() + bytes);
}

// Flips one byte of key's payload, `at` bytes into it, on the card image.
void damage(adp::testing::FaultImage& image, const std::string& key, size_t at) {
  auto found = std::search(image.data.begin(), image.data.end(), key.begin(), key.end());
  check(found != image.data.end(), "the object's key " + key + " is on the card");
  if (found == image.data.end()) return;
  size_t header = size_t(found - image.data.begin()) & ~size_t(4095);
  image.data[header + 4096 + at] ^= 1;
}

// A load of key, damaged `at` bytes into its payload: a miss, counted once, dropped.
void damaged_load(std::shared_ptr<adp::CardStore> store, adp::testing::FaultImage& image, const std::string& key,
                  size_t bytes, size_t at) {
  const std::string what = std::to_string(bytes >> 20) + " MiB: ";
  const uint64_t failures = store->stats().checksum_failures;
  damage(image, key, at);
  adp::AlignedBuffer mem;
  mem.reserve(bytes);
  auto c = embedded_connector(store, 1, 30000);
  Completion got = run(*c, OpType::kGet, {key}, {{mem.data(), bytes}});
  check(got.per_key == std::vector<uint8_t>{0}, what + "a damaged object is a miss");
  check(store->stats().checksum_failures == failures + 1, what + "the damage is counted once");
  check(!store->exists(key), what + "the damaged object is dropped from the index");
  c->close();
}

// A slow load of an object deleted while the card reads its first request:
// `ordered` (a load straight into the buffer, header with the payload): the
// delete waits for the read, and the load is a hit with the object's bytes;
// otherwise (staged) the tombstone lands in the header block before the read
// ends, and the load is a miss in a future that succeeds, the buffer
// untouched. Either way the delete succeeds.
void deleted_while_read(std::shared_ptr<adp::CardStore> store, SlowDevice* dev, const std::string& key,
                        const std::vector<uint8_t>& want, bool ordered) {
  const size_t bytes = want.size();
  adp::AlignedBuffer mem;
  mem.reserve(bytes);
  std::memset(mem.data(), 0x5a, bytes);
  auto c = embedded_connector(store, 1, 30000);
  dev->reads_started = 0;
  dev->slow = true;
  uint64_t id = c->submit(OpType::kGet, {key}, {{mem.data(), bytes}}, nullptr);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (dev->reads_started.load() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  check(dev->reads_started.load() == 1, "the load's first read started (header block and payload)");
  adp::IoContext ctx;
  adp::Status removed = store->remove(ctx, key);
  check(removed.ok(), "the delete during the read succeeds: " + removed.message());
  Completion got = wait_for(*c, id);
  dev->slow = false;
  const std::string what = std::to_string(bytes >> 20) + " MiB deleted while it is read: ";
  if (ordered) {
    check(got.ok && got.per_key == std::vector<uint8_t>{1}, what + "a hit, ordered before the delete: " + got.error);
    check(std::memcmp(mem.data(), want.data(), bytes) == 0, what + "the buffer holds the object's bytes");
  } else {
    check(got.ok && got.per_key == std::vector<uint8_t>{0}, what + "a miss (future ok): " + got.error);
    std::vector<uint8_t> untouched(bytes, 0x5a);
    check(std::memcmp(mem.data(), untouched.data(), bytes) == 0, what + "the buffer is untouched");
  }
  check(!store->exists(key), what + "the delete is done");
  c->close();
}

}  // namespace

int main() {
  auto image = std::make_shared<adp::testing::FaultImage>(kCardBytes);
  SlowDevice* dev;
  std::shared_ptr<adp::CardStore> store =
      adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes), "open", &dev, "slow-disk-card");
  if (!store) return 1;
  check(!store->memory_speed(), "the test card is not memory-speed (its loads go in pieces)");

  const std::vector<uint8_t> want = store_object(store, kKey, kObjectBytes);
  for (size_t offset : {size_t(0), size_t(8)}) {
    late_load(store, dev, kKey, kObjectBytes, offset, 100);  // 1 s to read, its first piece 0.5 s
    timely_load(store, dev, kKey, offset, want);
  }
  // One flipped byte in the first piece (its CRC on the CrcWorker), then in
  // another object's last piece (its CRC on the worker), then in a third's
  // first piece again, near its start.
  damaged_load(store, *image, kKey, kObjectBytes, (20u << 20) + 12345);
  for (const auto& [other, at] : {std::pair<std::string, size_t>{"m@00000000@0@large-2", (62u << 20) + 777},
                                  {"m@00000000@0@large-3", (1u << 20) + 333}}) {
    store_object(store, other, kObjectBytes);
    damaged_load(store, *image, other, kObjectBytes, at);
  }

  // One piece (staged): 62 ms to read, past a 20 ms deadline.
  const std::string small = "m@00000000@0@small";
  const std::vector<uint8_t> want_small = store_object(store, small, kSmallBytes);
  late_load(store, dev, small, kSmallBytes, 0, 20);
  timely_load(store, dev, small, 0, want_small);
  damaged_load(store, *image, small, kSmallBytes, (3u << 20) + 777);
  const std::string doomed = "m@00000000@0@deleted-while-read";
  deleted_while_read(store, dev, doomed, store_object(store, doomed, kSmallBytes), false);
  const std::string doomed_large = "m@00000000@0@large-deleted-while-read";
  deleted_while_read(store, dev, doomed_large, store_object(store, doomed_large, kObjectBytes), true);

  return adp::testing::finish("disk_load_test");
}
