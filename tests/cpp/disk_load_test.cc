// SPDX-License-Identifier: Apache-2.0
// Loads from a disk card (ReadInto::kPieces: the card read straight into
// LMCache's buffer in pieces, each under the batch's guard and before its
// deadline), on a FaultDevice whose reads are slow (64 MiB/s, the bytes land
// when a read ends, as a DMA's would). Checks:
//   - a load past its deadline completes as failed, and nothing is written
//     into its buffer after that (4 KiB aligned buffer: read in pieces;
//     unaligned: staged, then copied under the guard), and the load stops
//     reading once it is late instead of reading the rest of the object;
//   - with a deadline it can meet, the same loads return the object's bytes;
//   - a damaged byte in a middle piece of a large object makes it a miss,
//     counted, and the object is dropped.
// The Connector over the embedded backend, one worker.
//
//   disk_load_test
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "connector/connector.h"
#include "store/card_store.h"
#include "testing/fault_device.h"
#include "transport/embedded_backend.h"
#include "util/aligned_buffer.h"

namespace {

using adp::Buffer;
using adp::Completion;
using adp::Connector;
using adp::OpType;

constexpr uint64_t kCardBytes = 256ull << 20;
constexpr uint64_t kRegionBytes = 16ull << 20;
constexpr size_t kObjectBytes = 32u << 20;  // 8 pieces of 4 MiB (kGuardedPieceBytes)
const char* const kKey = "m@00000000@0@large";

using adp::testing::check;
using adp::testing::check_failures;

// Reads take 1 s per 64 MiB while slow; the data lands when the read ends.
class SlowDevice : public adp::testing::FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  adp::Status readv(uint64_t offset, const iovec* iov, int count) const override {
    if (slow.load()) {
      uint64_t n = 0;
      for (int i = 0; i < count; i++) n += iov[i].iov_len;
      std::this_thread::sleep_for(std::chrono::microseconds(n / 64));  // 64 MiB/s: ~16 us per KiB
      payload_reads++;
    }
    return FaultDevice::readv(offset, iov, count);
  }
  std::atomic<bool> slow{false};
  mutable std::atomic<int> payload_reads{0};
};

Completion wait(Connector& c, uint64_t id) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    for (auto& done : c.drain())
      if (done.future_id == id) return done;
    if (std::chrono::steady_clock::now() > deadline) {
      printf("future %llu did not complete\n", static_cast<unsigned long long>(id));
      std::exit(1);
    }
    pollfd p{c.event_fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
  }
}

Completion run(Connector& c, OpType op, std::vector<std::string> keys, std::vector<Buffer> bufs) {
  return wait(c, c.submit(op, std::move(keys), std::move(bufs), nullptr));
}

std::unique_ptr<Connector> connect(std::shared_ptr<adp::CardStore> store, int timeout_ms) {
  adp::ConnectorOptions opts;
  opts.num_workers = 1;
  opts.timeout_ms = timeout_ms;
  return std::make_unique<Connector>(std::make_unique<adp::EmbeddedBackend>(std::move(store)), opts);
}

// A load into dst (offset bytes into an aligned buffer) past a 100 ms deadline.
void late_load(std::shared_ptr<adp::CardStore> store, SlowDevice* dev, size_t offset) {
  const std::string what = offset ? "unaligned buffer: " : "aligned buffer: ";
  adp::AlignedBuffer mem;
  mem.reserve(kObjectBytes + offset);
  uint8_t* dst = mem.data() + offset;
  std::memset(dst, 0x5a, kObjectBytes);
  auto c = connect(store, 100);
  dev->payload_reads = 0;
  dev->slow = true;
  Completion got = run(*c, OpType::kGet, {kKey}, {{dst, kObjectBytes}});
  std::vector<uint8_t> at_completion(dst, dst + kObjectBytes);
  // Reading the whole object takes 0.5 s: wait that long again, so that a
  // load that went on would have written by now.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  check(!got.ok && got.error.find("timed out") != std::string::npos,
        what + "a load past its deadline fails as timed out: '" + got.error + "'");
  check(got.per_key == std::vector<uint8_t>{0}, what + "the late key is a miss");
  check(std::memcmp(at_completion.data(), dst, kObjectBytes) == 0,
        what + "nothing was written into the buffer after its future completed");
  if (!offset)
    check(dev->payload_reads.load() < int(kObjectBytes / (4u << 20)), what + "the load stopped reading once late (" +
                                                                          std::to_string(dev->payload_reads.load()) +
                                                                          " reads of 8 pieces)");
  c->close();
  dev->slow = false;
}

// The same load with a deadline it meets.
void timely_load(std::shared_ptr<adp::CardStore> store, SlowDevice* dev, size_t offset,
                 const std::vector<uint8_t>& want) {
  const std::string what = offset ? "unaligned buffer: " : "aligned buffer: ";
  adp::AlignedBuffer mem;
  mem.reserve(kObjectBytes + offset);
  uint8_t* dst = mem.data() + offset;
  std::memset(dst, 0x5a, kObjectBytes);
  auto c = connect(store, 30000);
  dev->slow = true;
  Completion got = run(*c, OpType::kGet, {kKey}, {{dst, kObjectBytes}});
  dev->slow = false;
  check(got.ok && got.per_key == std::vector<uint8_t>{1}, what + "a slow load within its deadline hits: " + got.error);
  check(std::memcmp(dst, want.data(), kObjectBytes) == 0, what + "the loaded bytes are the object's");
  c->close();
}

}  // namespace

int main() {
  auto image = std::make_shared<adp::testing::FaultImage>(kCardBytes);
  auto owned = std::make_unique<SlowDevice>(image, "slow-disk-card");
  SlowDevice* dev = owned.get();
  adp::CardOptions co;
  co.region_bytes = kRegionBytes;
  std::unique_ptr<adp::CardStore> opened;
  adp::Status s = adp::CardStore::OpenDevice(std::move(owned), co, &opened);
  if (!s.ok()) {
    printf("open failed: %s\n", s.message().c_str());
    return 1;
  }
  std::shared_ptr<adp::CardStore> store(std::move(opened));
  check(!store->memory_speed(), "the test card is not memory-speed (its loads go in pieces)");

  adp::AlignedBuffer src;
  src.reserve(kObjectBytes);
  for (size_t i = 0; i < kObjectBytes; i++) src.data()[i] = static_cast<uint8_t>(i * 131 + (i >> 20));
  std::vector<uint8_t> want(src.data(), src.data() + kObjectBytes);
  {
    auto c = connect(store, 30000);
    Completion put = run(*c, OpType::kSet, {kKey}, {{src.data(), kObjectBytes}});
    check(put.ok, "the store succeeds: " + put.error);
    c->close();
  }

  for (size_t offset : {size_t(0), size_t(8)}) {
    late_load(store, dev, offset);
    timely_load(store, dev, offset, want);
  }

  // One flipped byte in the fifth of eight pieces: a miss, counted, dropped.
  const std::string key(kKey);
  auto at = std::search(image->data.begin(), image->data.end(), key.begin(), key.end());
  check(at != image->data.end(), "the object's key is on the card");
  if (at != image->data.end()) {
    size_t header = size_t(at - image->data.begin()) & ~size_t(4095);
    image->data[header + 4096 + (17u << 20) + 12345] ^= 1;
  }
  adp::AlignedBuffer mem;
  mem.reserve(kObjectBytes);
  auto c = connect(store, 30000);
  Completion got = run(*c, OpType::kGet, {kKey}, {{mem.data(), kObjectBytes}});
  check(got.per_key == std::vector<uint8_t>{0}, "an object damaged in a middle piece is a miss");
  check(store->stats().checksum_failures == 1, "the damage is counted once");
  check(!store->exists(kKey), "the damaged object is dropped from the index");
  c->close();

  if (check_failures) {
    printf("disk_load_test: %d checks failed\n", check_failures);
    return 1;
  }
  printf("disk_load_test: PASS\n");
  return 0;
}
