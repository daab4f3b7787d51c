// SPDX-License-Identifier: Apache-2.0
// docs/card_format.md, Recovery ("Progress is logged every 5 s") and DESIGN.md ("reported progress on a large
// card"): an open whose region walk takes longer than 5 s logs "recovering card C: R/N regions scanned, K objects
// so far" at INFO while it walks. A card large enough to take that long is not made here: the read of one
// region's header block sleeps 5.5 s instead, on a fault device (a slow medium). The program opens the card and
// checks what it recovered; tests/store/test_recovery_progress.py runs it at ADP_LOG_LEVEL=INFO and looks for the
// line (review34: the promise had no test).
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::IoContext;
using adp::testing::FaultImage;

constexpr uint64_t kRegion = 1u << 20;
constexpr uint64_t kRegion1 = adp::kDataOffset + kRegion;  // region 1's header block
const adp::CardOptions kCard = adp::testing::card_options(kRegion);

// Its first read that covers region 1's header block sleeps 5.5 s first.
struct SlowHeaderDevice : adp::testing::FaultDevice {
  SlowHeaderDevice(std::shared_ptr<FaultImage> image, std::string name) : FaultDevice(std::move(image), name) {}
  adp::Status readv(uint64_t offset, const iovec* iov, int count) const override {
    uint64_t len = 0;
    for (int i = 0; i < count; i++) len += iov[i].iov_len;
    if (offset <= kRegion1 && kRegion1 < offset + len && !slept_) {
      slept_ = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5500));
    }
    return FaultDevice::readv(offset, iov, count);
  }
  mutable bool slept_ = false;  // one recovery thread reads a region's header
};

}  // namespace

int main() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  {
    auto s = adp::testing::checked_fault_card(image, kCard, "format");
    if (!s) return 1;
    IoContext ctx;
    std::vector<uint8_t> v(100000, 7);  // 10 a region: regions 0 and 1 hold records
    for (int i = 0; i < 15; i++) CHECK(adp::testing::put_one(*s, ctx, "k" + std::to_string(i), v).ok(), "put %d", i);
    s.reset();  // a clean close
  }
  auto t0 = std::chrono::steady_clock::now();
  auto s = adp::testing::checked_fault_card<SlowHeaderDevice>(image, kCard, "open on a slow medium");
  if (!s) return 1;
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took >= 5.5, "the open took %.2f s: the slow header read was not reached", took);
  const uint64_t objects = s->stats().objects;
  CHECK(objects == 15, "recovered %llu objects, not 15", static_cast<unsigned long long>(objects));
  s.reset();
  return adp::testing::finish("recovery_progress_test");
}
