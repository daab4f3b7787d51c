// SPDX-License-Identifier: Apache-2.0
// Recovery resumes its walk behind a damaged object header (docs/card_format.md,
// Recovery, "Damage that reads back wrong"), on a fault device. Built and run
// by tests/store/test_recovery_damage.py, and under ASan+UBSan and TSan by
// tests/sanitizers/test_sanitizers.py.
//   - Damaged headers (two in one region, one of a record continuing into the
//     next region): every other object reads back, the damage costs its
//     records only.
//   - A store behind a hole that could not be marked (its write failed, then
//     the pad over it): not acknowledged, and its copy on the card voided. A
//     walk resumed behind damage in front of the hole finds that copy; with
//     its own seq it would outrank a delete of its key acknowledged after it
//     failed, and the deleted key would be back.
//   - A store cut in flight behind a crash's hole (its write landed, the one
//     reserved before it did not: never acknowledged), its key stored again
//     and deleted after the restart, then damage in front of the hole: the
//     walk resumed behind the damage must not find the cut copy, whose seq
//     (never seen by the restart's recovery) outranks that delete.
//   - A record header that could not be read at an open (a transient error),
//     readable again at the next: its record, lost at that open, stays lost
//     (the open padded over it), as its walk could not see its seq; the
//     records behind it were found at that open (since session 33: until
//     then the walk ended at the block and they were lost too).
//   - An unreadable block inside a read-ahead window behind damage (the
//     region's free tail behind a damaged object header; a record's payload
//     behind a damaged region header): the blocks in front of it are read
//     one by one, so the objects there are found (and counted) as without
//     the read-ahead, not lost with the window's failed read.
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "store/card_store.h"
#include "test_card.h"

namespace {

using adp::IoContext;
using adp::testing::check;
using adp::testing::FaultImage;
using adp::testing::header_block;

constexpr uint64_t kRegion = 1u << 20;
const adp::CardOptions kCard = adp::testing::card_options(kRegion);

std::vector<uint8_t> value(int i, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t j = 0; j < n; j++) v[j] = static_cast<uint8_t>(i * 131 + j * 7);
  return v;
}

// Flips a bit of the payload_bytes field of key's header: its checksum fails.
void damage(FaultImage& image, const std::string& key) { image.data[header_block(image, key) + 40] ^= 1; }

void damaged_headers_cost_their_records() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  constexpr size_t kSize = 300 << 10;  // footprint 304 KiB: the fourth continues into the next region
  std::vector<std::string> keys;
  {
    auto s = adp::testing::checked_fault_card(image, kCard, "open");
    if (!s) return;
    IoContext ctx;
    for (int i = 0; i < 9; i++) {
      keys.push_back("obj-" + std::to_string(i));
      check(adp::testing::put_one(*s, ctx, keys.back(), value(i, kSize)).ok(), "store " + keys.back());
    }
  }
  for (const char* k : {"obj-1", "obj-3"}) damage(*image, k);  // obj-3 continues into the next region
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  adp::StoreStats st = s->stats();
  check(st.recovery_damaged_regions == 1 && st.recovery_lost_objects == 2, "two damaged headers, two records lost");
  check(st.recovery_lost_bytes == 2 * kSize, "their bytes: both records' payload");
  for (int i = 0; i < 9; i++) {
    bool lost = keys[i] == "obj-1" || keys[i] == "obj-3";
    auto got = adp::testing::read_object(*s, keys[i]);
    check(lost ? !got : got == value(i, kSize), keys[i] + (lost ? " is a miss" : " reads back"));
  }
}

void store_behind_an_unmarked_hole_is_voided() {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  constexpr size_t kSize = 20000;
  const auto v1 = value(1, kSize), front = value(2, kSize), a = value(3, kSize), v2 = value(4, kSize);
  {
    adp::testing::FaultDevice* dev;
    auto s = adp::testing::checked_fault_card(image, kCard, "open", &dev);
    if (!s) return;
    IoContext c0, ca, cb;
    check(adp::testing::put_one(*s, c0, "k", v1).ok(), "first store of k");
    check(adp::testing::put_one(*s, c0, "front", front).ok(), "store of front");
    const uint64_t a_at = header_block(*image, "front") + adp::object_footprint(kSize);
    const uint64_t w0 = dev->writes();
    dev->hold_write(w0);  // A's record write: stuck in flight
    adp::Status ar, br;
    std::thread ta([&] { ar = adp::testing::put_one(*s, ca, "a", a); });
    while (!dev->write_held()) std::this_thread::yield();
    std::thread tb([&] { br = adp::testing::put_one(*s, cb, "k", v2); });  // reserved behind A: written, waits for A
    while (dev->writes() < w0 + 2) std::this_thread::yield();
    dev->fail_writes(a_at, a_at + adp::kBlockSize);  // A's pad cannot be written either
    dev->release_held_write(true);
    ta.join();
    tb.join();
    check(!ar.ok(), "the store whose write failed is not acknowledged");
    check(br.message().find("could not be marked") != std::string::npos,
          "the store behind the unmarked hole fails: " + br.message());
    adp::Status d = s->remove(c0, "k");
    check(d.ok(), "the delete of k after its store failed: " + d.message());
    dev->power_cut();
  }
  damage(*image, "front");  // in front of the hole: the walk resumes behind it
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  check(s->stats().recovery_damaged_regions == 1, "front's header is damage");
  auto got = adp::testing::read_object(*s, "k");
  check(!got,
        std::string("k was deleted after its store failed and is back") + (got == v2 ? " (the failed copy)" : ""));
}

// A fault device whose reads of [bad_from, bad_to) fail from its creation: recovery at the open meets them.
struct UnreadableDevice : adp::testing::FaultDevice {
  UnreadableDevice(std::shared_ptr<FaultImage> image, std::string name) : FaultDevice(std::move(image), name) {
    fail_reads(bad_from, bad_to);
  }
  static inline uint64_t bad_from = 0, bad_to = 0;
};

// A card on a new image holding prefix-0 .. prefix-(n-1), each value(i, size), stored one after the other.
std::shared_ptr<FaultImage> stored_card(const std::string& prefix, int n, size_t size) {
  auto image = std::make_shared<FaultImage>(adp::testing::card_bytes(8, kRegion));
  auto s = adp::testing::checked_fault_card(image, kCard, "open");
  IoContext ctx;
  for (int i = 0; s && i < n; i++)
    check(adp::testing::put_one(*s, ctx, prefix + std::to_string(i), value(i, size)).ok(),
          "store " + prefix + std::to_string(i));
  return image;
}

void unreadable_block_ahead_of_the_resume() {
  constexpr size_t kSize = 100 << 10;  // footprint 104 KiB: three in region 0 end 316 KiB into it
  auto image = stored_card("tail-", 3, kSize);
  damage(*image, "tail-1");
  // A never-written block of the region's free tail, 240 KiB behind tail-1's header block: inside the 256 KiB the
  // resume reads ahead from there, behind tail-2 (its header 104 KiB behind tail-1's).
  const uint64_t h1 = header_block(*image, "tail-1");
  UnreadableDevice::bad_from = h1 + 244 * 1024;
  UnreadableDevice::bad_to = UnreadableDevice::bad_from + adp::kBlockSize;
  auto s = adp::testing::checked_fault_card<UnreadableDevice>(image, kCard, "reopen");
  if (!s) return;
  adp::StoreStats st = s->stats();
  check(st.recovery_damaged_regions == 1 && st.recovery_lost_objects == 1, "tail-1's damaged header: one record lost");
  check(st.media_errors == 0, "no read the walk needs fails: media_errors " + std::to_string(st.media_errors));
  check(adp::testing::read_object(*s, "tail-0") == value(0, kSize), "tail-0 reads back");
  check(!adp::testing::read_object(*s, "tail-1"), "tail-1 is a miss");
  check(adp::testing::read_object(*s, "tail-2") == value(2, kSize),
        "tail-2, behind the damage and in front of the unreadable block, reads back");
}

void unreadable_block_behind_a_damaged_region_header() {
  constexpr size_t kSize = 300 << 10;  // footprint 304 KiB: the fourth continues 196 KiB into region 1
  auto image = stored_card("cont-", 7, kSize);
  // Region 1 (after the continuation of region 0's last record): cont-4 at 200 KiB, cont-5 at 504 KiB, cont-6 at
  // 808 KiB (continuing into region 2). Its header's reserved field flipped (the checksum fails, the epoch holds).
  const uint64_t r1 = adp::kDataOffset + kRegion;
  check(header_block(*image, "cont-4") == r1 + (200 << 10), "cont-4 is region 1's first record");
  image->data[r1 + 48] ^= 1;
  // A block of cont-4's payload, inside the 256 KiB the look behind the header reads ahead from 4 KiB.
  UnreadableDevice::bad_from = r1 + (256 << 10);
  UnreadableDevice::bad_to = UnreadableDevice::bad_from + adp::kBlockSize;
  auto s = adp::testing::checked_fault_card<UnreadableDevice>(image, kCard, "reopen");
  if (!s) return;
  adp::StoreStats st = s->stats();
  check(st.recovery_damaged_regions == 1, "region 1's header is damage");
  // Counted lost: cont-4, cont-5 and cont-6, found behind the header (cont-3, whose continuation the region held,
  // is dropped as any record whose continuation is gone).
  check(st.recovery_lost_objects == 3, "cont-4, cont-5 and cont-6 counted lost behind the damaged region header: " +
                                           std::to_string(st.recovery_lost_objects));
  for (int i = 0; i < 3; i++)
    check(adp::testing::read_object(*s, "cont-" + std::to_string(i)) == value(i, kSize),
          "cont-" + std::to_string(i) + " reads back");
}

void store_cut_behind_a_crash_hole_stays_cut() {
  constexpr size_t kSize = 20000;
  auto image = stored_card("key-", 3, kSize);  // key-0, key-1, key-2: seq 1, 2, 3, one after the other
  // A power cut kept key-2's write and not key-1's, reserved before it (a disk's cache reorders unsynced writes):
  // key-1's place is what it held before, zeros; key-2 was never acknowledged (it waited for key-1's write).
  const uint64_t h1 = header_block(*image, "key-1");
  std::fill(image->data.begin() + h1, image->data.begin() + h1 + adp::object_footprint(kSize), 0);
  {
    auto s = adp::testing::checked_fault_card(image, kCard, "restart");
    if (!s) return;
    check(s->stats().objects == 1, "after the restart: key-0 only (the walk ends at key-1's hole)");
    IoContext ctx;
    check(adp::testing::put_one(*s, ctx, "key-2", value(9, kSize)).ok(), "key-2 stored again after the restart");
    adp::Status d = s->remove(ctx, "key-2");
    check(d.ok(), "then deleted: " + d.message());
  }
  damage(*image, "key-0");  // in front of the hole: the walk resumes behind it
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen");
  if (!s) return;
  check(s->stats().recovery_damaged_regions == 1, "key-0's header is damage");
  auto got = adp::testing::read_object(*s, "key-2");
  check(!got, std::string("key-2 was deleted after the restart and is back") +
                  (got == value(2, kSize) ? " (the copy cut behind the hole)" : ""));
}

// behind_damage: gone-0's header damaged too, so that the block is met by the look behind the damage (skip_damage),
// not by the walk itself.
void unreadable_at_an_open_stays_lost_once_readable(bool behind_damage) {
  constexpr size_t kSize = 20000;
  auto image = stored_card("gone-", 3, kSize);  // gone-0, gone-1, gone-2: seq 1, 2, 3
  if (behind_damage) damage(*image, "gone-0");
  UnreadableDevice::bad_from = header_block(*image, "gone-1");
  UnreadableDevice::bad_to = UnreadableDevice::bad_from + adp::kBlockSize;
  {
    auto s = adp::testing::checked_fault_card<UnreadableDevice>(image, kCard, "open, gone-1's header unreadable");
    if (!s) return;
    const adp::StoreStats st = s->stats();
    check(st.objects == (behind_damage ? 1u : 2u) && st.media_errors == 1,
          "gone-1 lost with the unreadable block (media error), gone-2 behind it found: " + std::to_string(st.objects) +
              " objects");
    check(adp::testing::read_object(*s, "gone-2") == value(2, kSize), "gone-2, behind the unreadable block, loads");
    IoContext ctx;
    check(adp::testing::put_one(*s, ctx, "gone-2", value(9, kSize)).ok(), "gone-2 stored again");
    adp::Status d = s->remove(ctx, "gone-2");
    check(d.ok(), "then deleted: " + d.message());
  }
  UnreadableDevice::bad_from = UnreadableDevice::bad_to = 0;
  auto s = adp::testing::checked_fault_card(image, kCard, "reopen, the block readable again");
  if (!s) return;
  auto got = adp::testing::read_object(*s, "gone-2");
  check(!got, std::string("gone-2 was deleted after the open that could not read gone-1 and is back") +
                  (got == value(2, kSize) ? " (its copy from before that open)" : ""));
  check(!adp::testing::read_object(*s, "gone-1"), "gone-1, padded over at the open that could not read it, is back");
}

}  // namespace

int main() {
  damaged_headers_cost_their_records();
  store_behind_an_unmarked_hole_is_voided();
  store_cut_behind_a_crash_hole_stays_cut();
  unreadable_at_an_open_stays_lost_once_readable(false);
  unreadable_at_an_open_stays_lost_once_readable(true);
  unreadable_block_ahead_of_the_resume();
  unreadable_block_behind_a_damaged_region_header();
  return adp::testing::finish("damage_resume_test");
}
