// SPDX-License-Identifier: Apache-2.0
// DESIGN.md, "The card store: what it must guarantee": "Before its first eviction a card holds at least 97% of
// its size in payload for chunks of 256 KiB and up". Each object costs a 4 KiB header block and its payload
// rounded up to 4 KiB (docs/card_format.md, Capacity), so a chunk just over a 4 KiB multiple near 256 KiB pays
// almost two blocks: 256 KiB + 1 byte is 262145 / 270336 = 96.97% before the superblock and region headers, on
// a card of any size (and 260 KiB + 1 on cards up to 8 GiB). docs/card_format.md states the dip for objects
// above 1/35 of the card (64 MiB on 2 GiB) but not this one, and tests/store/test_capacity.py's sizes are all
// 4 KiB multiples but one (5 MiB + 12345, which reaches 97%). This program fills a 256 MiB card (128 regions,
// the default geometry) with one size each and checks first_eviction_held_bytes against 97% of the card.
// Fails on the code of session 32 (review33a F3) for 256 KiB + 1 and 260 KiB + 1: a promise broken, or a
// promise to restate (DESIGN.md and docs/card_format.md) for 4 KiB-multiple chunks only.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::testing::check;
using adp::testing::FaultImage;

constexpr uint64_t kCardBytes = 256u << 20;

void fill_holds_97_percent(size_t size) {
  auto image = std::make_shared<FaultImage>(kCardBytes);
  auto s = adp::testing::checked_fault_card(image, adp::testing::card_options(0), "open");
  if (!s) return;
  adp::IoContext ctx;
  const std::vector<uint8_t> value(size, 3);
  for (int i = 0; s->stats().evicted_objects == 0; i++)
    check(adp::testing::put_one(*s, ctx, "model@0@0@" + std::to_string(i), value).ok(), "store");
  const double held = double(s->stats().first_eviction_held_bytes) / double(kCardBytes);
  std::printf("%zu-byte chunks: %.4f of the card held at the first eviction\n", size, held);
  check(held >= 0.97, std::to_string(size) + "-byte chunks (256 KiB and up): " + std::to_string(held * 100) +
                          "% of the card held at the first eviction, under 97%");
}

}  // namespace

int main() {
  fill_holds_97_percent(256u << 10);        // 4 KiB multiple: holds
  fill_holds_97_percent((256u << 10) + 1);  // one byte more: a whole 4 KiB block of padding
  fill_holds_97_percent((260u << 10) + 1);
  fill_holds_97_percent((1u << 20) + 1);  // holds
  return adp::testing::finish("fill_promise_test");
}
