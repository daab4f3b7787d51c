// SPDX-License-Identifier: Apache-2.0
// A card operation that fails for want of this process's memory is counted
// in memory_failures, not io_errors (the card's I/O errors): a load whose
// staging cannot grow ("out of memory for staging", IoClass::kGatewayMemory,
// CardStore::read_and_check), a load whose bounce buffer cannot
// (get_via_bounce) and a store whose staging cannot (that one also in
// store_failures). The address space is limited with RLIMIT_AS, as in
// verify_test; the card (a fault device: not mapped, so loads and unaligned
// stores are staged) stays healthy, and with the memory back the object loads.
//
//   memory_failure_test
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::AlignedBuffer;
using adp::CardStore;
using adp::CopyFn;
using adp::IoContext;
using adp::Status;
using adp::StoreStats;
using adp::testing::check;
using adp::testing::FaultImage;

constexpr uint64_t kRegionBytes = 32ull << 20;
constexpr uint64_t kCardBytes = adp::testing::card_bytes(8, kRegionBytes);
constexpr size_t kBig = 20u << 20;

std::string counts(const StoreStats& st) {
  return "io_errors " + std::to_string(st.io_errors) + ", memory_failures " + std::to_string(st.memory_failures) +
         ", store_failures " + std::to_string(st.store_failures) + ", healthy " + std::to_string(st.healthy);
}

}  // namespace

int main() {
  auto image = std::make_shared<FaultImage>(kCardBytes);
  std::unique_ptr<CardStore> s =
      adp::testing::checked_fault_card(image, adp::testing::card_options(kRegionBytes), "open");
  if (!s) return 1;
  const std::vector<uint8_t> big = adp::testing::pattern(kBig, 3);
  {
    IoContext ctx;
    check(adp::testing::put_one(*s, ctx, "oom@big", big).ok(), "the big store succeeds");
  }
  // Everything the loads and the store below need but their staging and bounce buffer, made first: a
  // destination one byte off 4 KiB (so the load is staged whole), fresh contexts (their staging grows from
  // nothing), an unaligned copy of the payload to store (staged whole too).
  std::vector<uint8_t> dst(kBig + 4096);
  uint8_t* off = dst.data() + (4096 - reinterpret_cast<uintptr_t>(dst.data()) % 4096) % 4096 + 1;
  std::vector<uint8_t> again(big.begin(), big.end());
  IoContext load_ctx, store_ctx;
  AlignedBuffer bounce, hold;
  const std::string store_key = "oom@again";
  auto deliver = [&](size_t, const CopyFn& copy) { return copy(off); };
  auto with_ctx = [&](const std::function<void(IoContext&)>& f) {
    f(load_ctx);
    return true;
  };
  auto accept = [](size_t) { return true; };
  auto sink = [](size_t, const uint8_t*, size_t) { return true; };
  Status load, bounced, stored;
  {
    adp::testing::AddressSpaceLimit limit(8u << 20);
    load = s->get(load_ctx, "oom@big", deliver);
    bounced = s->get_via_bounce("oom@big", accept, with_ctx, {&bounce, 1}, &hold, sink, {}, 16u << 20);
    stored = adp::testing::put_one(*s, store_ctx, store_key, again.data() + 1, kBig - 1);
  }
  check(load.code() == Status::Code::kIoError && load.io_class() == Status::IoClass::kGatewayMemory,
        "the load fails for want of staging: '" + load.message() + "'");
  check(bounced.code() == Status::Code::kIoError && bounced.io_class() == Status::IoClass::kGatewayMemory,
        "the bounce load fails for want of its bounce buffer: '" + bounced.message() + "'");
  check(stored.code() == Status::Code::kIoError && stored.io_class() == Status::IoClass::kGatewayMemory,
        "the store fails for want of staging: '" + stored.message() + "'");
  StoreStats st = s->stats();
  check(st.io_errors == 0, "no card I/O error is counted for this process's memory (" + counts(st) + ")");
  check(st.memory_failures == 3, "the three operations are counted in memory_failures (" + counts(st) + ")");
  check(st.store_failures == 1, "the store is a store failure (" + counts(st) + ")");
  check(st.healthy, "the card stays healthy (" + counts(st) + ")");
  Status st_load;
  auto got = adp::testing::read_object(*s, "oom@big", &st_load);
  check(got.has_value() && *got == big, "with the memory back the object loads: '" + st_load.message() + "'");
  return adp::testing::finish("memory_failure_test");
}
