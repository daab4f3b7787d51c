// SPDX-License-Identifier: Apache-2.0
// The card store of the C++ test programs of tests/cpp that drive one
// directly: a card on an in-memory fault device (testing/fault_device.h) or on
// an image file, its options, its opening with a failure a CHECK (check.h),
// and the one-object store and load their checks go through. Beside
// test_gateway.h, which does the same for an in-process gateway.
#pragma once

#include <sys/resource.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_format.h"
#include "store/card_store.h"
#include "testing/fault_device.h"

namespace adp::testing {

// The size of a card of `regions` regions of `region_bytes`: the superblock area, then the regions.
constexpr uint64_t card_bytes(uint64_t regions, uint64_t region_bytes) { return kDataOffset + regions * region_bytes; }

// A test card's options: durable (the default), regions of `region_bytes` when it is formatted (0: chosen
// from its size); for CardStore::Open, the image file `path`, created with `create_bytes` if it is not there.
inline CardOptions card_options(uint64_t region_bytes, const std::string& path = "", uint64_t create_bytes = 0) {
  CardOptions co;
  co.path = path;
  co.create_bytes = create_bytes;
  co.region_bytes = region_bytes;
  return co;
}

// The small card of the eviction tests (evict_header, transient_retire, free_region_tombstone, region_wait):
// 8 regions of 1 MiB, objects of 200,000 bytes (five a region), keys "model@0@0@<i>".
namespace small_card {
inline constexpr uint64_t kRegion = 1u << 20;
inline constexpr uint64_t kRegions = 8;
inline const CardOptions kCard = card_options(kRegion);
inline const std::vector<uint8_t> kValue(200000, 7);
inline std::string key(int i) { return "model@0@0@" + std::to_string(i); }
}  // namespace small_card

// CardStore::OpenDevice on a new Dev(image, name) (a FaultDevice, or a test's own class derived from it)
// with `co`: a blank image is formatted (co.region_bytes), one that holds a card is recovered. *dev, when
// given, is the device, owned by the store; each open is a new device over the same image, as a restart
// is a new process over the same card (no fault armed).
template <class Dev = FaultDevice>
Status open_fault_card(const std::shared_ptr<FaultImage>& image, const CardOptions& co, std::unique_ptr<CardStore>* out,
                       Dev** dev = nullptr, const std::string& name = "fault-card") {
  auto owned = std::make_unique<Dev>(image, name);
  if (dev) *dev = owned.get();
  return CardStore::OpenDevice(std::move(owned), co, out);
}

// The same, a failure a CHECK ("<what>: <why>"): the store, or nullptr.
template <class Dev = FaultDevice>
std::unique_ptr<CardStore> checked_fault_card(const std::shared_ptr<FaultImage>& image, const CardOptions& co,
                                              const std::string& what, Dev** dev = nullptr,
                                              const std::string& name = "fault-card") {
  std::unique_ptr<CardStore> s;
  Status st = open_fault_card(image, co, &s, dev, name);
  CHECK(st.ok(), "%s: %s", what.c_str(), st.message().c_str());
  return st.ok() ? std::move(s) : nullptr;
}

// CardStore::Open(co) (the image file co.path), a failure a CHECK ("<what>: <why>"): the store, or nullptr.
inline std::unique_ptr<CardStore> checked_card(const CardOptions& co, const std::string& what) {
  std::unique_ptr<CardStore> s;
  Status st = CardStore::Open(co, &s);
  CHECK(st.ok(), "%s: %s", what.c_str(), st.message().c_str());
  return st.ok() ? std::move(s) : nullptr;
}

// Stores one object (`size` bytes at `data`) under `key` through ctx; its result. `wanted` is what the
// store is told when it asks whether its caller still waits (false: the caller gave up).
inline Status put_one(CardStore& s, IoContext& ctx, const std::string& key, const uint8_t* data, size_t size,
                      bool wanted = true) {
  PutItem item{key, data, size};
  Status r;
  s.put(ctx, &item, 1, &r, [wanted] { return wanted; });
  return r;
}

inline Status put_one(CardStore& s, IoContext& ctx, const std::string& key, const std::vector<uint8_t>& value,
                      bool wanted = true) {
  return put_one(s, ctx, key, value.data(), value.size(), wanted);
}

// The number of stores of `value` under key(0), key(1), .. into a new card of `regions` regions (co) before the
// store that makes its first eviction (the same on every new card: one writer, no reads); -1 if it cannot be opened.
template <class KeyFn>
int stores_before_first_eviction(uint64_t regions, const CardOptions& co, const std::vector<uint8_t>& value,
                                 KeyFn key) {
  auto image = std::make_shared<FaultImage>(card_bytes(regions, co.region_bytes));
  auto s = checked_fault_card(image, co, "probe open");
  if (!s) return -1;
  IoContext ctx;
  for (int i = 0;; i++) {
    check(put_one(*s, ctx, key(i), value).ok(), "probe store");
    if (s->stats().evicted_objects) return i;
  }
}

// The bytes of the object under `key`, or nothing on a miss (NotFound) or an error; *st, when given, is
// the load's status.
inline std::optional<std::vector<uint8_t>> read_object(CardStore& s, IoContext& ctx, const std::string& key,
                                                       Status* st = nullptr) {
  std::vector<uint8_t> out;
  Status r = s.get(ctx, key, [&](size_t size, const CopyFn& copy) {
    out.resize(size);
    return copy(out.data());
  });
  if (st) *st = r;
  if (!r.ok()) return std::nullopt;
  return out;
}

// The same through an IoContext of its own.
inline std::optional<std::vector<uint8_t>> read_object(CardStore& s, const std::string& key, Status* st = nullptr) {
  IoContext ctx;
  return read_object(s, ctx, key, st);
}

// Holds this process's address space (RLIMIT_AS) to what it is now and `slack` bytes more while it lives: a
// buffer that would grow past that is refused (the store's "out of memory ..."), as on a host short of memory.
// Whatever the code under test needs besides is made before.
class AddressSpaceLimit {
 public:
  explicit AddressSpaceLimit(uint64_t slack) {
    getrlimit(RLIMIT_AS, &old_);
    rlimit limited = old_;
    limited.rlim_cur = vm_size() + slack;
    check(setrlimit(RLIMIT_AS, &limited) == 0, "RLIMIT_AS is set");
  }
  ~AddressSpaceLimit() { setrlimit(RLIMIT_AS, &old_); }
  AddressSpaceLimit(const AddressSpaceLimit&) = delete;
  AddressSpaceLimit& operator=(const AddressSpaceLimit&) = delete;

 private:
  // This process's address space now (VmSize), in bytes.
  static uint64_t vm_size() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
    return 0;
  }
  rlimit old_{};
};

// The image offset of the header block of the object stored under key (its key follows the header in
// that block), or UINT64_MAX.
inline uint64_t header_block(const FaultImage& image, const std::string& key) {
  std::string_view all(reinterpret_cast<const char*>(image.data.data()), image.data.size());
  size_t at = all.find(key);
  return at == std::string_view::npos ? UINT64_MAX : at / kBlockSize * kBlockSize;
}

// What a tombstone write cut part way leaves of the header at `block`: some of its bytes changed.
inline void half_overwrite(FaultImage& image, uint64_t block) {
  for (uint64_t i = 8; i < 40; i++) image.data[block + i] ^= 0x5a;
}

// A delete of `key` on a thread of its own, its tombstone write held on `dev` before it touches the image
// (the object still indexed, the delete in flight) from construction until finish().
class HeldDelete {
 public:
  HeldDelete(CardStore& s, FaultDevice& dev, const std::string& key) : dev_(dev) {
    dev.hold_write(dev.writes());
    thread_ = std::thread([this, &s, key] {
      IoContext ctx;
      removed_ = s.remove(ctx, key);
    });
    while (!dev.write_held()) std::this_thread::yield();
  }
  ~HeldDelete() {
    if (thread_.joinable()) finish();
  }
  // Lets the tombstone write go on (whole); the delete's result.
  Status finish() {
    dev_.release_held_write(false);
    thread_.join();
    return removed_;
  }

 private:
  FaultDevice& dev_;
  std::thread thread_;
  Status removed_ = Status::IoError("not run");
};

}  // namespace adp::testing
