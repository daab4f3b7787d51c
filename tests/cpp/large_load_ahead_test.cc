// SPDX-License-Identifier: Apache-2.0
// CardStore::get_each with objects of more than a piece (read straight into
// 4 KiB aligned buffers, as the embedded backend's loads of LMCache's 32 MiB
// chunks, session 37): each object's CRC runs on its context's CrcWorker while
// the next key's object is read, and only then are its header and tail
// checked. Checks, on a FaultDevice that logs its reads and writes:
//   - the next key's object is read before this key's load ends (its tail,
//     copied from staging after the CRC, comes after the next key's read);
//     every key hits with the stored bytes, in one piece a load (the backend's
//     32 MiB) and in 4 MiB pieces;
//   - a damaged object (the second of three) is a miss, counted once and
//     dropped, its tombstone written after the next key's object was read;
//     the keys around it hit; a damaged last key (nothing read beside its CRC)
//     and damage in a later piece alike;
//   - an absent key read ahead is a miss; a key whose pieces decline fails
//     TimedOut (as get()) with its buffer untouched, the keys around it hit;
//   - objects of one piece or less among them (staged) load as before;
//   - a damaged key twice in a row: the damage counted once, two misses;
//   - a damaged object (no tail) whose pieces decline once its CRC is known
//     (the buffer may be another object's by then): TimedOut, not counted
//     nor dropped; judged again with the pieces agreeing, a miss, dropped.
//   - in every load: deliver() and the pieces take one std::shared_mutex
//     shared, as the connector's batch guard, instrumented: no thread takes it
//     while it holds it (a staged key's copy runs inside its pieces, and the
//     next key of more than a piece read ahead there took it again: debt38);
//     deliver() is asked once a key (a large next key's unaligned buffer was
//     asked for twice: read ahead, then again by its load). Staged and large
//     keys in turn, one large key's buffer not 4 KiB aligned: every key hits.
//
//   large_load_ahead_test
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
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

constexpr uint64_t kRegionBytes = 16u << 20;
constexpr size_t kLarge = (6u << 20) + 100;  // more than a piece (4 MiB), with a partial last block (the tail)
constexpr size_t kSmall = 256u << 10;        // staged
constexpr size_t kExact = 5u << 20;          // more than a piece, no tail (not kLarge's body: 6 MiB)

// Logs the offsets of its reads ('R') and writes ('W'), in order.
class LoggingDevice : public adp::testing::FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  adp::Status readv(uint64_t offset, const iovec* iov, int count) const override {
    note('R', offset);
    return FaultDevice::readv(offset, iov, count);
  }
  adp::Status writev(uint64_t offset, const iovec* iov, int count) const override {
    note('W', offset);
    return FaultDevice::writev(offset, iov, count);
  }
  void note(char op, uint64_t offset) const {
    std::lock_guard<std::mutex> lock(mu);
    log.emplace_back(op, offset);
  }
  std::vector<std::pair<char, uint64_t>> take() const {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(log, {});
  }
  mutable std::mutex mu;
  mutable std::vector<std::pair<char, uint64_t>> log;
};

std::string key(int i) { return "m@00000000@0@large" + std::to_string(i); }

std::vector<uint8_t> pattern(int i, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t j = 0; j < n; j++) v[j] = static_cast<uint8_t>(j * 131 + (j >> 12) + i * 7);
  return v;
}

// One get_each of `keys` into aligned buffers (each of its object's size, filled with 0x5a first). Besides each
// key's Status: the order of the load's events, 'R' a device read (with the index of the key whose object it
// reads, -1 another's), 'W' a device write (the same), 'G' a pieces call for the whole object (its `upto`) with no
// device read inside: a tail's copy, or the check that a damaged object's buffer is still the caller's. `decline`: the
// key whose pieces of its object's body decline (known by deliver() asking for that key last, the next key's buffer
// asked for before this key's tail).
struct Load {
  std::vector<adp::Status> st;
  std::vector<adp::AlignedBuffer> dst;
  std::string events;        // e.g. "R0 R1 G R2 G G"
  std::vector<uint8_t*> at;  // the buffer deliver() gave each key (dst, or 8 bytes into it: `unaligned`)
};

// The caller's guard as the connector's (a batch's std::shared_mutex, taken shared by deliver() and by each piece),
// instrumented: a shared acquisition by a thread that holds it already is counted (undefined for std::shared_mutex;
// a writer-preferring lock deadlocks there once a writer queues between the two).
struct CheckedGuard {
  std::shared_mutex mu;
  int reentered = 0;  // this test's get_each runs on one thread
  static inline thread_local int held = 0;
  template <class F>
  bool shared(F&& f) {
    if (held) reentered++;
    std::shared_lock<std::shared_mutex> lock(mu);
    held++;
    const bool r = f();
    held--;
    return r;
  }
};

Load load(adp::CardStore& s, adp::IoContext& a, adp::IoContext& b, LoggingDevice* dev,
          const std::vector<std::string>& keys, const std::vector<size_t>& sizes,
          const std::vector<uint64_t>& header_at, int decline = -1, size_t piece_bytes = 32u << 20,
          bool decline_exact_check = false, int unaligned = -1) {
  const size_t n = keys.size();
  Load l{std::vector<adp::Status>(n), std::vector<adp::AlignedBuffer>(n), "", std::vector<uint8_t*>(n)};
  std::vector<std::string_view> views(keys.begin(), keys.end());
  for (size_t i = 0; i < n; i++) {
    l.dst[i].reserve(sizes[i] + 4096);
    l.at[i] = l.dst[i].data() + (int(i) == unaligned ? 8 : 0);
    std::memset(l.at[i], 0x5a, sizes[i]);
  }
  CheckedGuard guard;
  std::vector<int> asked(n, 0);
  dev->take();
  std::vector<std::pair<char, uint64_t>> log;  // the device's events and the tails, in order
  auto drain = [&] {
    for (auto& ev : dev->take()) log.push_back(ev);
  };
  size_t cur = 0;
  int exact_calls = 0;
  s.get_each(
      a, b, views.data(), n, l.st.data(),
      [&](size_t i, size_t size, const adp::CopyFn& copy) {
        cur = i;
        asked[i]++;
        return guard.shared([&] { return size == sizes[i] && copy(l.at[i]); });
      },
      [&](size_t upto, const std::function<void()>& piece) {
        const bool tail = upto == kLarge;
        if (int(cur) == decline && !tail) return false;
        // A kExact object's second call (its one piece's, then the check of its damage verdict): declined.
        if (upto == kExact && ++exact_calls == 2 && decline_exact_check) return false;
        return guard.shared([&] {
          drain();
          piece();
          drain();
          if (tail) log.emplace_back('G', 0);
          return true;
        });
      },
      piece_bytes);
  drain();
  check(guard.reentered == 0, "no thread takes the guard (shared) while it holds it: taken again " +
                                  std::to_string(guard.reentered) + " times");
  const int most = n ? *std::max_element(asked.begin(), asked.end()) : 0;
  check(most <= 1, "deliver() is asked once a key at most: asked " + std::to_string(most) + " times for one");
  for (auto& [op, at] : log) {
    if (!l.events.empty()) l.events += ' ';
    l.events += op;
    if (op == 'G') continue;
    int who = -1;
    for (size_t i = 0; i < n; i++)  // the key whose object (its header block, then its payload) holds the offset
      if (header_at[i] <= at && at < header_at[i] + 4096 + sizes[i]) who = int(i);
    l.events += std::to_string(who);
  }
  return l;
}

bool holds(const uint8_t* b, const std::vector<uint8_t>& want) { return std::memcmp(b, want.data(), want.size()) == 0; }
bool holds(const adp::AlignedBuffer& b, const std::vector<uint8_t>& want) { return holds(b.data(), want); }

bool untouched(const adp::AlignedBuffer& b, size_t n) {
  for (size_t j = 0; j < n; j++)
    if (b.data()[j] != 0x5a) return false;
  return true;
}

}  // namespace

int main() {
  auto image = std::make_shared<adp::testing::FaultImage>(adp::testing::card_bytes(12, kRegionBytes));
  LoggingDevice* dev;
  std::unique_ptr<adp::CardStore> s = adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes),
                                                                       "open", &dev, "logging-disk-card");
  if (!s) return 1;
  check(!s->memory_speed(), "the test card is not memory-speed (its objects of more than a piece are read direct)");
  adp::IoContext a, b;
  std::vector<std::string> keys;
  std::vector<std::vector<uint8_t>> want;
  std::vector<uint64_t> at;
  for (int i = 0; i < 9; i++) {
    keys.push_back(key(i));
    want.push_back(pattern(i, i == 7 ? kSmall : i == 8 ? kExact : kLarge));
    adp::Status st = adp::testing::put_one(*s, a, keys[i], want[i]);
    check(st.ok(), "the store of " + keys[i] + " succeeds: " + st.message());
    at.push_back(adp::testing::header_block(*image, keys[i]));
  }
  auto pick = [&](std::vector<int> idx) {
    std::vector<std::string> k;
    std::vector<size_t> n;
    std::vector<uint64_t> h;
    for (int i : idx) k.push_back(keys[i]), n.push_back(want[i].size()), h.push_back(at[i]);
    return std::make_tuple(k, n, h);
  };

  for (size_t piece : {size_t(32u << 20), size_t(4u << 20)}) {  // the backend's one piece, and two pieces a load
    const std::string how = piece == (32u << 20) ? " (one piece)" : " (4 MiB pieces)";
    auto [k, n, h] = pick({0, 1, 2, 3});
    Load l = load(*s, a, b, dev, k, n, h, -1, piece);
    for (size_t i = 0; i < k.size(); i++) {
      check(l.st[i].ok(), k[i] + " hits" + how + ": " + l.st[i].message());
      check(holds(l.dst[i], want[i]), k[i] + ": the loaded bytes are the object's" + how);
    }
    // Before the first tail: key 0's reads and key 1's. Each tail after the next key's read (the last one alone).
    const std::string want_events = piece == (32u << 20) ? "R0 R1 G R2 G R3 G G" : "R0 R0 R1 R1 G R2 R2 G R3 R3 G G";
    check(l.events == want_events, "each key's object read before the key before it is done (its tail)" + how +
                                       ": want " + want_events + ", got " + l.events);
  }

  {  // a damaged object read ahead: a miss, counted once, dropped after the next key's read; the keys around it hit
    image->data[at[4] + 4096 + 1000] ^= 1;
    auto [k, n, h] = pick({3, 4, 5});
    const uint64_t failures = s->stats().checksum_failures;
    Load l = load(*s, a, b, dev, k, n, h);
    check(l.st[0].ok() && l.st[2].ok(), "the keys around a damaged one hit");
    check(l.st[1].is_not_found(), "the damaged object is a miss: " + l.st[1].message());
    check(s->stats().checksum_failures == failures + 1, "the damage is counted once");
    check(!s->exists(keys[4]), "the damaged object is dropped from the index");
    check(holds(l.dst[0], want[3]) && holds(l.dst[2], want[5]), "the keys around the damaged one have their bytes");
    check(l.events == "R0 R1 G R2 G G W1 G",
          "the damaged key's tombstone is written after the next key's read: got " + l.events);
  }
  {  // damage in the last key (its CRC beside nothing) and in a later piece of a key loaded in 4 MiB pieces
    image->data[at[6] + 4096 + (5u << 20)] ^= 1;
    auto [k, n, h] = pick({5, 6});
    const uint64_t failures = s->stats().checksum_failures;
    Load l = load(*s, a, b, dev, k, n, h, -1, 4u << 20);
    check(l.st[0].ok() && holds(l.dst[0], want[5]), "the key before a damaged last key hits");
    check(l.st[1].is_not_found(), "a damaged last key (its second piece) is a miss: " + l.st[1].message());
    check(s->stats().checksum_failures == failures + 1 && !s->exists(keys[6]), "its damage counted, it is dropped");
  }
  {  // an absent key read ahead: a miss counted once; a key whose pieces decline: TimedOut, its buffer untouched
    auto [k, n, h] = pick({0, 1, 2, 3});
    k[1] = key(99);
    const uint64_t misses = s->stats().misses;
    Load l = load(*s, a, b, dev, k, n, h, 2);
    check(l.st[0].ok() && holds(l.dst[0], want[0]), "the key before an absent one hits");
    check(l.st[1].is_not_found(), "the absent key is a miss: " + l.st[1].message());
    check(s->stats().misses == misses + 1, "the absent key's miss is counted once");
    check(l.st[2].code() == adp::Status::Code::kTimedOut,
          "a key whose pieces decline fails TimedOut (as get()): " + l.st[2].message());
    check(untouched(l.dst[2], n[2]), "nothing is written into a declined key's buffer");
    check(l.st[3].ok() && holds(l.dst[3], want[3]), "the key after a declined one hits");
  }
  {  // objects of one piece or less among them: staged, as before
    auto [k, n, h] = pick({0, 7, 1, 7, 2});
    Load l = load(*s, a, b, dev, k, n, h);
    const int idx[] = {0, 7, 1, 7, 2};
    for (size_t i = 0; i < k.size(); i++)
      check(l.st[i].ok() && holds(l.dst[i], want[idx[i]]), k[i] + " hits among keys of both sizes");
  }
  {  // staged and large keys in turn: a large key after a staged one (read ahead inside the staged one's pieces, the
     // guard taken again), and a large key after a large one whose buffer is not 4 KiB aligned (asked for twice)
    auto [k, n, h] = pick({7, 0, 1, 2, 7, 3});
    Load l = load(*s, a, b, dev, k, n, h, -1, 32u << 20, false, 2);
    const int idx[] = {7, 0, 1, 2, 7, 3};
    for (size_t i = 0; i < k.size(); i++)
      check(l.st[i].ok() && holds(l.at[i], want[idx[i]]), k[i] + " hits among staged and large keys" +
                                                              (i == 2 ? " (its buffer unaligned)" : "") + ": " +
                                                              l.st[i].message());
  }
  {  // a damaged key twice in a row: not read ahead (it would be read before the first is judged)
    image->data[at[1] + 4096 + 1000] ^= 1;
    auto [k, n, h] = pick({0, 1, 1, 2});
    const uint64_t failures = s->stats().checksum_failures, misses = s->stats().misses;
    Load l = load(*s, a, b, dev, k, n, h);
    check(l.st[0].ok() && l.st[3].ok(), "the keys around a damaged key loaded twice hit");
    check(l.st[1].is_not_found() && l.st[2].is_not_found(), "a damaged key loaded twice is a miss both times");
    check(s->stats().checksum_failures == failures + 1, "the damage of a key loaded twice is counted once");
    check(s->stats().misses == misses + 2, "its two misses are counted once each");
  }
  {  // a damaged object without a tail, its buffer no longer the caller's when its CRC is judged: no verdict
    image->data[at[8] + 4096 + 1000] ^= 1;
    auto [k, n, h] = pick({5, 8});
    const uint64_t failures = s->stats().checksum_failures;
    Load l = load(*s, a, b, dev, k, n, h, -1, 32u << 20, true);
    check(l.st[0].ok() && holds(l.dst[0], want[5]), "the key before it hits");
    check(l.st[1].code() == adp::Status::Code::kTimedOut,
          "a damaged object whose pieces decline at its verdict fails TimedOut: " + l.st[1].message());
    check(s->stats().checksum_failures == failures && s->exists(keys[8]), "its damage is not counted, it stays");
    Load again = load(*s, a, b, dev, k, n, h);
    check(again.st[1].is_not_found(), "judged with the pieces agreeing, it is a miss: " + again.st[1].message());
    check(s->stats().checksum_failures == failures + 1 && !s->exists(keys[8]), "then counted and dropped");
  }
  return adp::testing::finish("large_load_ahead_test");
}
