// SPDX-License-Identifier: Apache-2.0
// CardStore::get_each (the embedded backend's load of a slice of several keys
// from a disk card, session 35): while one key's staged object (256 KiB) is
// copied into its buffer, its CRC computed on the way on the context's
// CrcWorker, the next key's object is read into the other context's staging.
// Checks, on a FaultDevice that counts its reads:
//   - the next key's object is read inside this key's `pieces` (one read each
//     for keys 0-2 of 4, none for the last): the disk gets its next request
//     while the copy runs, not after it;
//   - when `pieces` returns, the key's buffer holds all of its object's bytes
//     (the copy on the CrcWorker is waited for inside it), and every key's
//     bytes are the stored ones;
//   - a damaged object read ahead (the second of three) is a miss, counted
//     once and dropped; the keys around it hit;
//   - an absent key read ahead is a miss counted once; a key whose `pieces`
//     declines is not delivered (NotFound, as get()), the next key then read
//     and delivered as usual.
//   - a damaged key twice in a row (review35): the second is a miss as get()
//     answers it (the first dropped it from the index), the damage counted
//     once; read ahead, the second read the damaged object before the first
//     was judged and counted it again.
//
//   load_ahead_test
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"
#include "util/aligned_buffer.h"

namespace {

using adp::testing::check;

constexpr uint64_t kRegionBytes = 4u << 20;
constexpr size_t kBytes = 256u << 10;

class CountingDevice : public adp::testing::FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  adp::Status readv(uint64_t offset, const iovec* iov, int count) const override {
    reads++;
    return FaultDevice::readv(offset, iov, count);
  }
  mutable std::atomic<int> reads{0};
};

std::string key(int i) { return "m@00000000@0@ahead" + std::to_string(i); }

std::vector<uint8_t> pattern(int i) {
  std::vector<uint8_t> v(kBytes);
  for (size_t j = 0; j < kBytes; j++) v[j] = static_cast<uint8_t>(j * 131 + (j >> 12) + i * 7);
  return v;
}

// One get_each of `keys` into aligned buffers; per key: its Status, the device reads made inside its `pieces`, and
// whether its buffer held the object's bytes when `pieces` returned. `decline`: the key whose `pieces` declines.
struct Load {
  std::vector<adp::Status> st;
  std::vector<int> reads_in_piece;
  std::vector<bool> complete_at_return;
  std::vector<adp::AlignedBuffer> dst;
};

Load load(adp::CardStore& s, adp::IoContext& a, adp::IoContext& b, CountingDevice* dev,
          const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& want, int decline = -1) {
  const size_t n = keys.size();
  Load l{std::vector<adp::Status>(n), std::vector<int>(n, -1), std::vector<bool>(n, false),
         std::vector<adp::AlignedBuffer>(n)};
  std::vector<std::string_view> views(keys.begin(), keys.end());
  for (auto& d : l.dst) {
    d.reserve(kBytes);
    std::memset(d.data(), 0x5a, kBytes);
  }
  size_t cur = 0;  // the key deliver() was last asked for: the one whose pieces run next
  s.get_each(
      a, b, views.data(), n, l.st.data(),
      [&](size_t i, size_t size, const adp::CopyFn& copy) {
        cur = i;
        return size == kBytes && copy(l.dst[i].data());
      },
      [&](size_t, const std::function<void()>& piece) {
        if (int(cur) == decline) return false;
        const int before = dev->reads.load();
        piece();
        l.reads_in_piece[cur] = dev->reads.load() - before;
        l.complete_at_return[cur] = std::memcmp(l.dst[cur].data(), want[cur].data(), kBytes) == 0;
        return true;
      });
  return l;
}

}  // namespace

int main() {
  auto image = std::make_shared<adp::testing::FaultImage>(adp::testing::card_bytes(8, kRegionBytes));
  CountingDevice* dev;
  std::unique_ptr<adp::CardStore> s = adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes),
                                                                       "open", &dev, "counting-disk-card");
  if (!s) return 1;
  check(!s->memory_speed(), "the test card is not memory-speed (its loads of 256 KiB are staged)");
  adp::IoContext a, b;
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> want;
  for (int i = 0; i < 6; i++) {
    keys.push_back(key(i));
    want.push_back(pattern(i));
    adp::Status st = adp::testing::put_one(*s, a, keys[i], want[i]);
    check(st.ok(), "the store of " + keys[i] + " succeeds: " + st.message());
  }

  {  // four keys: each but the last has the next one's object read inside its pieces
    const std::vector<std::string> k(keys.begin(), keys.begin() + 4);
    const std::vector<std::vector<uint8_t>> w(want.begin(), want.begin() + 4);
    Load l = load(*s, a, b, dev, k, w);
    for (size_t i = 0; i < k.size(); i++) {
      check(l.st[i].ok(), k[i] + " hits: " + l.st[i].message());
      check(std::memcmp(l.dst[i].data(), w[i].data(), kBytes) == 0, k[i] + ": the loaded bytes are the object's");
      check(l.complete_at_return[i], k[i] + ": its buffer held the whole object when its pieces returned");
      const int want_reads = i + 1 < k.size() ? 1 : 0;
      check(l.reads_in_piece[i] == want_reads, k[i] + ": " + std::to_string(want_reads) +
                                                   " read(s) inside its pieces (the next key's object), got " +
                                                   std::to_string(l.reads_in_piece[i]));
    }
  }

  {  // an absent key read ahead: a miss counted once; a key whose pieces decline: TimedOut, the next one hits
    const std::vector<std::string> k{keys[0], key(99), keys[1], keys[2]};
    const std::vector<std::vector<uint8_t>> w{want[0], want[0], want[1], want[2]};
    const uint64_t misses = s->stats().misses;
    Load l = load(*s, a, b, dev, k, w, 2);
    check(l.st[0].ok() && l.st[3].ok(), "the keys around an absent one and a declined one hit");
    check(l.st[1].is_not_found(), "the absent key is a miss: " + l.st[1].message());
    check(l.st[2].is_not_found(), "a key whose pieces decline is not delivered (as get()): " + l.st[2].message());
    check(s->stats().misses == misses + 2, "the absent key's miss and the declined one's are counted once each");
    check(std::memcmp(l.dst[3].data(), w[3].data(), kBytes) == 0, "the key after a declined one has its bytes");
  }

  {  // a damaged object read ahead: a miss, counted once, dropped; the keys around it hit
    const uint64_t block = adp::testing::header_block(*image, keys[4]);
    image->data[block + 4096 + 1000] ^= 1;
    const std::vector<std::string> k{keys[3], keys[4], keys[5]};
    const std::vector<std::vector<uint8_t>> w{want[3], want[4], want[5]};
    const uint64_t failures = s->stats().checksum_failures;
    Load l = load(*s, a, b, dev, k, w);
    check(l.st[0].ok() && l.st[2].ok(), "the keys around a damaged one hit");
    check(l.st[1].is_not_found(), "the damaged object is a miss: " + l.st[1].message());
    check(s->stats().checksum_failures == failures + 1, "the damage is counted once");
    check(!s->exists(keys[4]), "the damaged object is dropped from the index");
    check(std::memcmp(l.dst[2].data(), w[2].data(), kBytes) == 0, "the key after the damaged one has its bytes");
  }
  {  // a damaged key twice in a row: the second is not read ahead (it would be read before the first is judged)
    const uint64_t block = adp::testing::header_block(*image, keys[1]);
    image->data[block + 4096 + 1000] ^= 1;
    const std::vector<std::string> k{keys[0], keys[1], keys[1], keys[2]};
    const std::vector<std::vector<uint8_t>> w{want[0], want[1], want[1], want[2]};
    const uint64_t failures = s->stats().checksum_failures, misses = s->stats().misses;
    Load l = load(*s, a, b, dev, k, w);
    check(l.st[0].ok() && l.st[3].ok(), "the keys around a damaged key loaded twice hit");
    check(l.st[1].is_not_found() && l.st[2].is_not_found(), "a damaged key loaded twice is a miss both times");
    check(s->stats().checksum_failures == failures + 1,
          "the damage of a key loaded twice in a row is counted once, got " +
              std::to_string(s->stats().checksum_failures - failures));
    check(s->stats().misses == misses + 2,
          "its two misses are counted once each, got " + std::to_string(s->stats().misses - misses));
    check(std::memcmp(l.dst[3].data(), w[3].data(), kBytes) == 0, "the key after it has its bytes");
  }
  return adp::testing::finish("load_ahead_test");
}
