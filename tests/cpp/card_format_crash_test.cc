// SPDX-License-Identifier: Apache-2.0
// Crashes while a fresh card is formatted (session 30): the crash harness (crash_harness.h) arms its faults only
// after the open, so a blank card's format (its superblock written to block 0, then synced:
// CardStore::FormatDevice) was never crashed. The gateway and the embedded connector format a blank card at their
// first start; the host may lose power or the process be killed in the middle. Built and run by
// tests/store/test_crash_consistency.py.
//
//   card_format_crash_test DIR
//
// On a fault-injecting device (testing/fault_device.h), the format's write and sync points counted on a clean
// open of a blank card, then at each of them (a CHECK that every fault was reached):
//   - write points: a power cut (whole; torn after 1 to 4096 bytes: inside the magic, inside the fields, at the
//     CRC, just after the 72-byte superblock, the whole block), a process crash (the same tears, every earlier
//     write kept), that write failed (the same tears);
//   - sync points: that sync failed, then a power cut (the superblock undone) or a process crash (it stays); and a
//     power cut after the sync;
// then the card is reopened as `status` / `verify` do (read-only, format_blank false: nothing written, no "foreign
// data") and as a gateway or connector does (format_blank true): it must open as a valid, empty card whose
// superblock's fields agree with the device and the region size asked for, and store and load.
// A card that holds data and whose superblock is torn (an explicit format over it interrupted) must be refused,
// untouched, with a message that says to run `lmcache-adp format`, whichever region header is still written, and
// formatted by that format; one cut before the format's write still opens with its objects.
// On image files in DIR: an image created (CardDevice::Open, new_image.cc) and left without a superblock (the
// process gone before the format), sparse and allocated, is formatted at the next open; one with a superblock
// torn by a process crash (its first 40 bytes written) is formatted again.
#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "store/card_device.h"
#include "store/card_format.h"
#include "store/card_store.h"
#include "test_card.h"
#include "testing/fault_device.h"

namespace {

using adp::CardOptions;
using adp::CardStore;
using adp::IoContext;
using adp::kBlockSize;
using adp::Status;
using adp::Superblock;
using adp::testing::card_bytes;
using adp::testing::card_options;
using adp::testing::FaultDevice;
using adp::testing::FaultImage;
using adp::testing::open_fault_card;
using adp::testing::put_one;
using adp::testing::read_object;

constexpr uint64_t kRegionBytes = 1ull << 20;
constexpr uint64_t kRegions = 10;
// Where a cut or failed write of the superblock's block is torn: inside the magic (1, 7), just after it (8),
// inside the fields (24, 40), before the CRC (67, 68), inside it (71), just after the superblock (72), after its
// first sector (512), the whole block (4096).
constexpr uint64_t kTears[] = {1, 7, 8, 24, 40, 67, 68, 71, 72, 512, kBlockSize};

int runs = 0;
int torn_refused = 0;  // torn_format_over_data runs whose superblock was torn (refused)

std::shared_ptr<FaultImage> blank_image() { return std::make_shared<FaultImage>(card_bytes(kRegions, kRegionBytes)); }

Superblock block0(const FaultImage& image) {
  Superblock sb{};
  std::memcpy(&sb, image.data.data(), sizeof sb);
  return sb;
}

// Block 0 holds a valid superblock whose fields agree with the device and the geometry asked for.
void check_superblock(const FaultImage& image, const std::string& what) {
  const Superblock sb = block0(image);
  CHECK(adp::valid_superblock(sb), "%s: block 0 is not a valid superblock after the reopen", what.c_str());
  CHECK(sb.format_version == adp::kFormatVersion && sb.block_size == kBlockSize && sb.card_bytes == image.data.size() &&
            sb.region_bytes == kRegionBytes && sb.num_regions == kRegions && sb.max_key_bytes == adp::kMaxKeyBytes &&
            sb.data_offset == adp::kDataOffset,
        "%s: the superblock's fields disagree (version %u, block %u, card %" PRIu64 " of %zu, region %" PRIu64
        ", %u regions, data at %" PRIu64 ")",
        what.c_str(), sb.format_version, sb.block_size, sb.card_bytes, image.data.size(), sb.region_bytes,
        sb.num_regions, sb.data_offset);
}

// Reopens the card after a crash in its format: as status and verify do (nothing written: a valid card or "no
// card", never "foreign data"), then as a gateway or a connector does (a valid, empty card that works).
void check_reopen(const std::shared_ptr<FaultImage>& image, const std::string& what) {
  runs++;
  {
    const std::vector<uint8_t> before = image->data;
    CardOptions ro = card_options(kRegionBytes);
    ro.format_blank = false;
    ro.read_only = true;
    std::unique_ptr<CardStore> s;
    Status st = open_fault_card(image, ro, &s);
    CHECK(st.ok() || st.code() == Status::Code::kNotFound,
          "%s: the read-only open (status, verify) refused the card: %s", what.c_str(), st.message().c_str());
    s.reset();
    CHECK(image->data == before, "%s: the read-only open wrote to the card", what.c_str());
  }
  std::unique_ptr<CardStore> s;
  Status st = open_fault_card(image, card_options(kRegionBytes), &s);
  CHECK(st.ok(), "%s: the reopen (format_blank) failed: %s", what.c_str(), st.message().c_str());
  if (!st.ok()) return;
  check_superblock(*image, what);
  CHECK(s->stats().objects == 0, "%s: the reopened card holds %" PRIu64 " objects", what.c_str(), s->stats().objects);
  IoContext ctx;
  const auto v = adp::testing::pattern(5000, 7);
  Status r = put_one(*s, ctx, "after-reopen", v);
  CHECK(r.ok() && read_object(*s, ctx, "after-reopen") == v, "%s: the card does not work after the reopen: %s",
        what.c_str(), r.message().c_str());
}

// The device of a crashed format: when it goes (the open that failed frees it) the host or the process goes with
// it (a power cut: the unsynced writes undone, or, keep_all_unsynced_at_cut, a process crash: all kept), and what
// it counted stays in *seen (did the fault come?).
struct Seen {
  uint64_t writes = 0, syncs_run = 0;
};
class CrashingDevice : public FaultDevice {
 public:
  CrashingDevice(std::shared_ptr<FaultImage> image, Seen* seen)
      : FaultDevice(std::move(image), "format-card"), seen_(seen) {}
  ~CrashingDevice() override {
    seen_->writes = writes();
    seen_->syncs_run = syncs_run();
    power_cut();
  }

 private:
  Seen* seen_;
};

// A gateway's first open of a blank card on a device with `arm` done; the open must fail (the fault is reached:
// `reached` says so from what the device counted), the device goes with a power cut or, `process_crash`, a
// process crash (every write kept: also the torn part of a write that failed, which reached the card), and the
// card is reopened. `may_open`: the fault is the backup superblock's failed write or sync, which a blank card's
// format outlives (formatted with block 0 alone; review39b): the open may succeed.
void crash_format(const std::string& what, const std::function<void(FaultDevice*)>& arm,
                  const std::function<bool(const Seen&)>& reached, bool process_crash, bool may_open = false) {
  auto image = blank_image();
  Seen seen;
  auto dev = std::make_unique<CrashingDevice>(image, &seen);
  if (process_crash) dev->keep_all_unsynced_at_cut();
  arm(dev.get());
  std::unique_ptr<CardStore> s;
  Status st = CardStore::OpenDevice(std::move(dev), card_options(kRegionBytes), &s);
  CHECK(!st.ok() || may_open, "%s: the open succeeded", what.c_str());
  s.reset();  // (if it succeeded: its device goes too)
  CHECK(reached(seen), "%s: the fault was never reached (%" PRIu64 " writes, %" PRIu64 " syncs)", what.c_str(),
        seen.writes, seen.syncs_run);
  check_reopen(image, what);
}

// The format's write and sync points: a clean open of a blank card.
void count_format(uint64_t* writes, uint64_t* syncs) {
  auto image = blank_image();
  FaultDevice* dev = nullptr;
  std::unique_ptr<CardStore> s;
  Status st = open_fault_card(image, card_options(kRegionBytes), &s, &dev);
  CHECK(st.ok(), "clean format: %s", st.message().c_str());
  *writes = dev->writes();
  *syncs = dev->syncs_run();
  std::printf("card_format_crash_test: format of a blank card: %" PRIu64 " writes, %" PRIu64 " syncs\n", *writes,
              *syncs);
  CHECK(*writes >= 1 && *syncs >= 1, "the format writes and syncs");
  s.reset();
  check_superblock(*image, "clean format");
}

std::string tear_name(const char* kind, uint64_t point, uint64_t tear) {
  return std::string(kind) + " at format write " + std::to_string(point) + " torn after " + std::to_string(tear) +
         " bytes";
}

void crash_every_point() {
  uint64_t writes = 0, syncs = 0;
  count_format(&writes, &syncs);
  std::vector<uint64_t> tears{0};
  tears.insert(tears.end(), std::begin(kTears), std::end(kTears));
  for (uint64_t w = 0; w < writes; w++) {
    auto past = [w](const Seen& s) { return s.writes > w; };
    for (uint64_t tear : tears) {
      crash_format(
          tear_name("power cut", w, tear), [&](FaultDevice* d) { d->cut_power_at_write(w, tear); }, past, false);
      crash_format(
          tear_name("process crash", w, tear), [&](FaultDevice* d) { d->cut_power_at_write(w, tear); }, past, true);
      // The write fails (its torn part on the card), the open fails (the backup's, write 0: it may not, as
      // crash_format says), the process exits: what it wrote stays.
      crash_format(
          tear_name("failed write", w, tear), [&](FaultDevice* d) { d->fail_write(w, tear); }, past, true, w == 0);
    }
  }
  for (uint64_t n = 0; n < syncs; n++) {
    auto past = [n](const Seen& s) { return s.syncs_run > n; };
    crash_format(
        "failed format sync " + std::to_string(n) + ", then a power cut", [&](FaultDevice* d) { d->fail_sync(n); },
        past, false, n == 0);
    crash_format(
        "failed format sync " + std::to_string(n) + ", then the process gone", [&](FaultDevice* d) { d->fail_sync(n); },
        past, true, n == 0);
  }
  // A power cut after the format's sync (the open done, nothing stored): the card is formatted, and stays so.
  auto image = blank_image();
  std::unique_ptr<CardStore> s;
  FaultDevice* dev = nullptr;
  CHECK(open_fault_card(image, card_options(kRegionBytes), &s, &dev).ok(), "open for a cut after the format");
  dev->power_cut();
  s.reset();
  const std::vector<uint8_t> formatted(image->data.begin(), image->data.begin() + kBlockSize);
  check_reopen(image, "power cut after the format's sync");
  CHECK(std::equal(formatted.begin(), formatted.end(), image->data.begin()),
        "power cut after the format's sync: the reopen formatted the card again");
  std::printf("card_format_crash_test: %" PRIu64 " write points x %zu crashes, %" PRIu64
              " sync points x 2 crashes, a cut after the sync\n",
              writes, 3 * tears.size(), syncs);
}

// A card holding objects, whose explicit format (`lmcache-adp format`: FormatDevice) is cut at its write `write`
// (0: the backup superblock's, 1: block 0's, the backup synced before it), torn after `tear` bytes; `zero_region0`:
// region 0's header zeroed before (the data is in other regions); `older_build`: the backup zeroed after the cut
// (an older build's format, which wrote block 0 only, over a card of its own: no backup).
void torn_format_over_data(uint64_t write, uint64_t tear, bool zero_region0, bool older_build) {
  runs++;
  const std::string what = "format over a card with data cut at its write " + std::to_string(write) + " torn after " +
                           std::to_string(tear) + " bytes" + (zero_region0 ? " (region 0's header zeroed)" : "") +
                           (older_build ? " (an older build's: no backup)" : "");
  auto image = blank_image();
  {
    std::unique_ptr<CardStore> s;
    CHECK(open_fault_card(image, card_options(kRegionBytes), &s).ok(), "%s: first open", what.c_str());
    IoContext ctx;
    for (int i = 0; i < 12; i++)  // 12 x 1 MiB: the frontier moves through regions and evicts
      CHECK(put_one(*s, ctx, "k" + std::to_string(i), adp::testing::pattern(1000 * 1000, uint8_t(i))).ok(),
            "%s: store %d", what.c_str(), i);
  }
  if (zero_region0) std::memset(image->data.data() + adp::kDataOffset, 0, kBlockSize);
  const uint64_t old_id = block0(*image).card_id;
  {
    FaultDevice dev(image, "format-card");
    dev.cut_power_at_write(write, tear);
    CHECK(!CardStore::FormatDevice(dev, kRegionBytes).ok(), "%s: the format's cut was not reached", what.c_str());
  }
  if (older_build) std::memset(image->data.data() + adp::kDataOffset - kBlockSize, 0, kBlockSize);
  Superblock backup{};
  std::memcpy(&backup, image->data.data() + adp::kDataOffset - kBlockSize, sizeof backup);
  const std::vector<uint8_t> before = image->data;
  const Superblock cut = block0(*image);
  std::unique_ptr<CardStore> s;
  Status st = open_fault_card(image, card_options(kRegionBytes), &s);
  if (adp::valid_superblock(cut)) {
    // Torn before the new card id (the fields before it are the same geometry's: block 0 is the old superblock),
    // the card opens with its objects; torn after the superblock (or its CRC's last bytes the same), formatted.
    // Block 0 wins over the backup, and the backup is made block 0's again.
    const bool old = cut.card_id == old_id;
    CHECK(st.ok() && (s->stats().objects > 0) == old, "%s: not opened as the %s card: %s", what.c_str(),
          old ? "old" : "formatted", st.message().c_str());
    CHECK(write == 1 || old, "%s: block 0 changed by a cut at the backup's write", what.c_str());
    CHECK(std::memcmp(image->data.data(), image->data.data() + adp::kDataOffset - kBlockSize, kBlockSize) == 0,
          "%s: the backup was not rewritten from block 0", what.c_str());
    return;
  }
  if (adp::valid_superblock(backup)) {
    // Block 0 torn after the new card id, the backup (written and synced first) the new card's: it opens, empty,
    // with the backup (no refusal), and block 0 is rewritten from it. Never the old card's objects.
    CHECK(!older_build && write == 1 && backup.card_id != old_id, "%s: a backup of card %" PRIx64, what.c_str(),
          backup.card_id);
    CHECK(st.ok() && s->stats().objects == 0, "%s: not opened as the new card with the backup: %s", what.c_str(),
          st.ok() ? std::to_string(s->stats().objects).c_str() : st.message().c_str());
    CHECK(std::memcmp(image->data.data(), image->data.data() + adp::kDataOffset - kBlockSize, kBlockSize) == 0,
          "%s: block 0 was not rewritten from the backup", what.c_str());
    return;
  }
  torn_refused++;
  CHECK(!st.ok() && st.message().find("torn") != std::string::npos &&
            st.message().find("lmcache-adp format --card") != std::string::npos,
        "%s: the reopen was not refused as a torn card with data (%s)", what.c_str(),
        st.ok() ? "opened" : st.message().c_str());
  CHECK(image->data == before, "%s: the refused open wrote to the card", what.c_str());
  FaultDevice dev(image, "format-card");
  CHECK(CardStore::FormatDevice(dev, kRegionBytes).ok(), "%s: `lmcache-adp format` failed", what.c_str());
  s.reset();
  CHECK(open_fault_card(image, card_options(kRegionBytes), &s).ok() && s->stats().objects == 0,
        "%s: not opened after `lmcache-adp format`", what.c_str());
}

// An image file made and left without a superblock, or with one torn (the process gone in the format).
void image_files(const std::string& dir) {
  const uint64_t bytes = card_bytes(kRegions, kRegionBytes);
  for (bool allocated : {false, true}) {
    runs++;
    const std::string path = dir + (allocated ? "/allocated.img" : "/sparse.img");
    {
      std::unique_ptr<adp::CardDevice> dev;
      Status st =
          adp::CardDevice::Open(path, bytes, &dev, adp::CardDevice::Access::kReadWrite,
                                allocated ? adp::CardDevice::Creation::kAllocated : adp::CardDevice::Creation::kSparse);
      CHECK(st.ok(), "create %s: %s", path.c_str(), st.message().c_str());
    }  // the process gone before the format
    CardOptions co = card_options(kRegionBytes, path, bytes);
    co.format_blank = false;
    co.read_only = true;
    std::unique_ptr<CardStore> s;
    Status st = CardStore::Open(co, &s);
    CHECK(st.code() == Status::Code::kNotFound && st.message().find("block 0 is blank") != std::string::npos,
          "%s: status/verify: %s", path.c_str(), st.message().c_str());
    co = card_options(kRegionBytes, path, bytes);
    st = CardStore::Open(co, &s);
    CHECK(st.ok() && s->stats().objects == 0 && s->stats().capacity_bytes > 0, "%s, left unformatted: reopen: %s",
          path.c_str(), st.message().c_str());
  }
  // A process crash inside the superblock's write of a new image: its first 40 bytes there.
  runs++;
  const std::string whole = dir + "/whole.img", torn = dir + "/torn.img";
  CHECK(CardStore::Format(whole, bytes, kRegionBytes).ok(), "format %s", whole.c_str());
  {
    std::unique_ptr<adp::CardDevice> dev;
    CHECK(adp::CardDevice::Open(torn, bytes, &dev).ok(), "create %s", torn.c_str());
  }
  uint8_t sb[40];
  int in = ::open(whole.c_str(), O_RDONLY), out = ::open(torn.c_str(), O_WRONLY);
  CHECK(in >= 0 && out >= 0 && ::pread(in, sb, sizeof sb, 0) == ssize_t(sizeof sb) &&
            ::pwrite(out, sb, sizeof sb, 0) == ssize_t(sizeof sb) && ::fsync(out) == 0,
        "a torn superblock written into %s", torn.c_str());
  ::close(in);
  ::close(out);
  std::unique_ptr<CardStore> s;
  Status st = CardStore::Open(card_options(kRegionBytes, torn, bytes), &s);
  CHECK(st.ok() && s->stats().objects == 0, "%s, its superblock torn after 40 bytes: reopen: %s", torn.c_str(),
        st.message().c_str());
}

// ---- The backup superblock (session 39): a copy of block 0 at kBackup (1 MiB - 4 KiB), written and synced first
// by a format. A bad block 0 with a valid backup opens with the backup (every object kept), a read-write open
// rewrites the bad copy from the good one; both bad: refused (or blank) as before session 39.

constexpr uint64_t kBackup = adp::kDataOffset - kBlockSize;
constexpr int kObjects = 20;

std::string object_key(int i) { return "obj" + std::to_string(i); }
std::vector<uint8_t> object_value(int i) { return adp::testing::pattern(100 * 1000, uint8_t(i + 1)); }

// A card holding kObjects objects of 100 KB (no eviction), closed cleanly.
std::shared_ptr<FaultImage> used_card() {
  auto image = blank_image();
  std::unique_ptr<CardStore> s;
  CHECK(open_fault_card(image, card_options(kRegionBytes), &s).ok(), "used card: first open");
  IoContext ctx;
  for (int i = 0; i < kObjects; i++)
    CHECK(put_one(*s, ctx, object_key(i), object_value(i)).ok(), "used card: store %d", i);
  return image;
}

uint8_t* block_at(FaultImage& image, uint64_t offset) { return image.data.data() + offset; }
bool same_block(const FaultImage& image, uint64_t a, uint64_t b) {
  return std::memcmp(image.data.data() + a, image.data.data() + b, kBlockSize) == 0;
}

// Every object of used_card() loads.
void check_objects(CardStore& s, const std::string& what, uint64_t objects = kObjects) {
  IoContext ctx;
  CHECK(s.stats().objects == objects, "%s: %" PRIu64 " objects, not %" PRIu64, what.c_str(), s.stats().objects,
        objects);
  for (int i = 0; i < kObjects; i++)
    CHECK(read_object(s, ctx, object_key(i)) == object_value(i), "%s: object %d does not load", what.c_str(), i);
}

uint64_t stat(const CardStore& s, const char* name) {
  uint64_t v = UINT64_MAX;
  adp::for_each_stat(s.stats(), [&](const char* k, auto x) {
    if (std::strcmp(k, name) == 0) v = static_cast<uint64_t>(x);
  });
  CHECK(v != UINT64_MAX, "no stat %s", name);
  return v;
}

// How a copy of the superblock (at `offset`) is damaged.
// kTail: the superblock intact, bytes past it (zeros on a card) damaged (sbfix40: block 0 so was reported as the
// backup being "another superblock").
enum class Bad { kZeroed, kGarbage, kTorn, kUnreadable, kUnreadableUnwritable, kOtherCard, kTail };
const char* bad_name(Bad b) {
  switch (b) {
    case Bad::kZeroed:
      return "zeroed";
    case Bad::kGarbage:
      return "garbage";
    case Bad::kTorn:
      return "torn";
    case Bad::kUnreadable:
      return "unreadable";
    case Bad::kUnreadableUnwritable:
      return "unreadable and unwritable";
    case Bad::kOtherCard:
      return "another card's";
    case Bad::kTail:
      return "damaged past its superblock";
  }
  return "?";
}

void damage(FaultImage& image, uint64_t offset, Bad b) {
  uint8_t* p = block_at(image, offset);
  switch (b) {
    case Bad::kZeroed:
      std::memset(p, 0, kBlockSize);
      break;
    case Bad::kGarbage: {
      const auto g = adp::testing::pattern(kBlockSize, 99);
      std::memcpy(p, g.data(), kBlockSize);
      break;
    }
    case Bad::kTorn:
      std::memset(p + 40, 0, kBlockSize - 40);
      break;  // its first 40 bytes: magic and fields
    case Bad::kOtherCard: {
      Superblock sb{};
      std::memcpy(&sb, p, sizeof sb);
      sb.card_id ^= 0x5a5a;
      sb.crc = adp::superblock_crc(sb);
      std::memcpy(p, &sb, sizeof sb);
      break;
    }
    case Bad::kTail: {
      const auto g = adp::testing::pattern(kBlockSize - 512, 77);
      std::memcpy(p + 512, g.data(), g.size());
      break;
    }
    case Bad::kUnreadable:
    case Bad::kUnreadableUnwritable:
      break;  // the device's faults
  }
}

std::unique_ptr<FaultDevice> damaged_device(const std::shared_ptr<FaultImage>& image, uint64_t offset, Bad b) {
  auto dev = std::make_unique<FaultDevice>(image, "backup-card");
  if (b == Bad::kUnreadable || b == Bad::kUnreadableUnwritable) dev->fail_reads(offset, offset + kBlockSize);
  if (b == Bad::kUnreadableUnwritable) dev->fail_writes(offset, offset + kBlockSize);
  return dev;
}

// One copy (`offset`: block 0 or the backup) of a used card's superblock damaged as `b`: the card opens with all
// its objects, read-only (nothing written) and read-write (the bad copy rewritten from the good one, where its
// block takes writes), and the next open finds both copies good.
void one_copy_bad(uint64_t offset, Bad b) {
  runs++;
  const bool block0 = offset == 0;
  const std::string what = std::string(block0 ? "block 0" : "the backup superblock") + " " + bad_name(b);
  auto image = used_card();
  CHECK(same_block(*image, 0, kBackup), "%s: the format did not write the backup superblock", what.c_str());
  damage(*image, offset, b);
  const std::vector<uint8_t> before = image->data;
  const uint64_t good = block0 ? kBackup : 0;
  {
    CardOptions ro = card_options(kRegionBytes);
    ro.format_blank = false;
    ro.read_only = true;
    std::unique_ptr<CardStore> s;
    Status st = CardStore::OpenDevice(damaged_device(image, offset, b), ro, &s);
    CHECK(st.ok(), "%s: the read-only open refused the card: %s", what.c_str(), st.message().c_str());
    if (st.ok()) {
      check_objects(*s, what + ", read-only");
      // A zeroed backup is a card of an older build's (no backup yet): superblock_backup_blank, not _bad (sbfix40).
      const char* said = block0              ? "superblock_block_zero_bad"
                         : b == Bad::kZeroed ? "superblock_backup_blank"
                                             : "superblock_backup_bad";
      uint64_t others = 0;
      for (const char* n : {"superblock_block_zero_bad", "superblock_backup_bad", "superblock_backup_blank"})
        if (std::strcmp(n, said) != 0) others += stat(*s, n);
      CHECK(stat(*s, said) == 1 && others == 0 && stat(*s, "superblock_rewritten") == 0,
            "%s, read-only: the superblock stats do not say which copy is bad (%s)", what.c_str(), said);
    }
    s.reset();
    CHECK(image->data == before, "%s: the read-only open wrote to the card", what.c_str());
  }
  const bool unwritable = b == Bad::kUnreadableUnwritable;
  if (block0 && b == Bad::kTail) {
    // Block 0's bytes past its superblock may be another program's (a partition table: `parted mklabel` keeps the
    // first 440 bytes): a read-write open without restore_block_zero opens the card and leaves block 0 as it is
    // (review40: it was rewritten at every read-write open); `verify --repair`'s option rewrites it (below).
    std::unique_ptr<CardStore> s;
    Status st = CardStore::OpenDevice(damaged_device(image, offset, b), card_options(kRegionBytes), &s);
    CHECK(st.ok(), "%s: the open refused the card: %s", what.c_str(), st.message().c_str());
    if (st.ok()) {
      check_objects(*s, what + ", a read-write open");
      CHECK(stat(*s, "superblock_block_zero_bad") == 1 && stat(*s, "superblock_rewritten") == 0 &&
                s->superblock_rewrite_error().empty(),
            "%s: a read-write open without restore_block_zero rewrote block 0, or its stats say so", what.c_str());
    }
    s.reset();
    CHECK(image->data == before, "%s: a read-write open without restore_block_zero wrote block 0", what.c_str());
  }
  {
    CardOptions rw = card_options(kRegionBytes);
    rw.restore_block_zero = block0 && b == Bad::kTail;
    std::unique_ptr<CardStore> s;
    Status st = CardStore::OpenDevice(damaged_device(image, offset, b), rw, &s);
    CHECK(st.ok(), "%s: the open refused the card: %s", what.c_str(), st.message().c_str());
    if (!st.ok()) return;
    check_objects(*s, what);
    CHECK(stat(*s, "superblock_rewritten") == (unwritable ? 0u : 1u), "%s: superblock_rewritten is %" PRIu64,
          what.c_str(), stat(*s, "superblock_rewritten"));
    // What failed where, for `verify --repair` to say (sbfix40: it named verify --repair itself as the remedy).
    const std::string want = "writing its " + std::string(block0 ? "superblock (block 0)" : "backup superblock") +
                             " (4096 bytes at offset " + std::to_string(offset) + ") failed: ";
    const std::string& said = s->superblock_rewrite_error();
    CHECK(unwritable ? said.find(want) == 0 && said.size() > want.size() : said.empty(),
          "%s: superblock_rewrite_error is '%s'", what.c_str(), said.c_str());
    IoContext ctx;
    const auto v = adp::testing::pattern(5000, 3);
    CHECK(put_one(*s, ctx, "after", v).ok() && read_object(*s, ctx, "after") == v, "%s: a store after the open",
          what.c_str());
  }
  if (unwritable) {  // the bad copy refused the rewrite: left as it was, the card served from the good one
    CHECK(std::memcmp(block_at(*image, offset), before.data() + offset, kBlockSize) == 0,
          "%s: a block that refuses writes changed", what.c_str());
    return;
  }
  CHECK(same_block(*image, 0, kBackup), "%s: the bad copy was not rewritten from the good one", what.c_str());
  CHECK(std::memcmp(block_at(*image, good), before.data() + good, kBlockSize) == 0, "%s: the good copy changed",
        what.c_str());
  std::unique_ptr<CardStore> s;
  FaultDevice* dev = nullptr;
  Status st = open_fault_card(image, card_options(kRegionBytes), &s, &dev);
  CHECK(st.ok() && stat(*s, "superblock_block_zero_bad") == 0 && stat(*s, "superblock_backup_bad") == 0,
        "%s: the next open: %s", what.c_str(), st.message().c_str());
  if (st.ok()) check_objects(*s, what + ", the next open", kObjects + 1);  // and "after"
}

// Both copies bad: the open refuses the card as before session 39 (block 0's refusal), writing nothing.
void both_bad(Bad b0, Bad backup, const char* refusal, bool with_data = true) {
  runs++;
  const std::string what = std::string("block 0 ") + bad_name(b0) + ", the backup " + bad_name(backup);
  auto image = with_data ? used_card() : blank_image();
  if (!with_data) {
    std::unique_ptr<CardStore> s;
    CHECK(open_fault_card(image, card_options(kRegionBytes), &s).ok(), "%s: format", what.c_str());
  }
  damage(*image, 0, b0);
  damage(*image, kBackup, backup);
  const std::vector<uint8_t> before = image->data;
  auto dev = damaged_device(image, 0, b0);
  if (backup == Bad::kUnreadable) dev->fail_reads(kBackup, kBackup + kBlockSize);
  std::unique_ptr<CardStore> s;
  Status st = CardStore::OpenDevice(std::move(dev), card_options(kRegionBytes), &s);
  CHECK(!st.ok() && st.message().find(refusal) != std::string::npos, "%s: not refused with '%s' (%s)", what.c_str(),
        refusal, st.ok() ? "opened" : st.message().c_str());
  s.reset();
  CHECK(image->data == before, "%s: the refused open wrote to the card", what.c_str());
}

// Block 0 holds readable bytes that are not a superblock of ours (not blank, not torn: `parted mklabel` or an mkfs
// run on the card device by mistake, or damage) beside a valid backup (fd39). No open can tell damage from another
// program's data: every open refuses it, writing nothing, naming the backup's card and the two ways on; only
// CardOptions::restore_block_zero (what `verify --repair` passes, read-write) rewrites block 0 from the backup and
// opens the card with its objects. `unwritable`: block 0 refuses writes, the repair's open serves the card as
// opened and the next open refuses it again. (sb39 took such a block 0 for damage where a region header of the
// backup's card checked out and rewrote it at any read-write open: the other program's data lost.)
void foreign_block_zero(bool unwritable) {
  runs++;
  const std::string what = std::string("block 0 garbage beside a valid backup") + (unwritable ? ", unwritable" : "");
  auto image = used_card();
  damage(*image, 0, Bad::kGarbage);
  const std::vector<uint8_t> before = image->data;
  Superblock backup{};
  std::memcpy(&backup, block_at(*image, kBackup), sizeof backup);
  char id[24];
  std::snprintf(id, sizeof id, "%016" PRIx64, backup.card_id);
  auto device = [&] {
    auto dev = std::make_unique<FaultDevice>(image, "backup-card");
    if (unwritable) dev->fail_writes(0, kBlockSize);
    return dev;
  };
  auto refused = [&](const CardOptions& co, const char* how) {
    std::unique_ptr<CardStore> s;
    Status st = CardStore::OpenDevice(device(), co, &s);
    CHECK(!st.ok(), "%s: %s opened the card", what.c_str(), how);
    for (const std::string& want :
         {std::string("block 0 is not an ADP superblock"), std::string("backup superblock at offset 1044480"),
          std::string("names card ") + id, std::string("10 regions of 1.00 MiB"), std::string("another program"),
          std::string("`lmcache-adp verify --card backup-card --repair`"),
          std::string("`lmcache-adp format --card backup-card --yes`")})
      CHECK(st.message().find(want) != std::string::npos, "%s: %s: the refusal does not say '%s': %s", what.c_str(),
            how, want.c_str(), st.message().c_str());
    s.reset();
    CHECK(image->data == before, "%s: %s wrote to the card", what.c_str(), how);
  };
  CardOptions ro = card_options(kRegionBytes);
  ro.format_blank = false;
  ro.read_only = true;
  refused(ro, "the read-only open (status, verify)");
  refused(card_options(kRegionBytes), "the read-write open (a gateway)");
  CardOptions ro_repair = ro;
  ro_repair.restore_block_zero = true;  // ignored read-only: nothing is written
  refused(ro_repair, "a read-only open with restore_block_zero");
  CardOptions repair = card_options(kRegionBytes);
  repair.format_blank = false;
  repair.restore_block_zero = true;
  {
    std::unique_ptr<CardStore> s;
    Status st = CardStore::OpenDevice(device(), repair, &s);
    CHECK(st.ok(), "%s: the open with restore_block_zero (verify --repair) refused: %s", what.c_str(),
          st.message().c_str());
    if (!st.ok()) return;
    check_objects(*s, what + ", repaired");
    CHECK(stat(*s, "superblock_block_zero_bad") == 1 && stat(*s, "superblock_backup_bad") == 0 &&
              stat(*s, "superblock_rewritten") == (unwritable ? 0u : 1u),
          "%s, repaired: the superblock stats do not say block 0 was bad and rewritten", what.c_str());
  }
  if (unwritable) {
    CHECK(std::memcmp(block_at(*image, 0), before.data(), kBlockSize) == 0, "%s: a block that refuses writes changed",
          what.c_str());
    refused(card_options(kRegionBytes), "the open after a repair whose write failed");
    return;
  }
  CHECK(same_block(*image, 0, kBackup), "%s: block 0 was not rewritten from the backup", what.c_str());
  std::unique_ptr<CardStore> s;
  Status st = open_fault_card(image, card_options(kRegionBytes), &s);
  CHECK(st.ok() && stat(*s, "superblock_block_zero_bad") == 0 && stat(*s, "superblock_backup_bad") == 0,
        "%s: the next open: %s", what.c_str(), st.message().c_str());
  if (st.ok()) check_objects(*s, what + ", the next open");
}

// A card formatted before session 39: no backup (zeros there). It opens as before; a read-only open writes nothing,
// a read-write one adds the backup.
void older_layout_card() {
  runs++;
  auto image = used_card();
  std::memset(block_at(*image, kBackup), 0, kBlockSize);
  one_copy_bad(kBackup, Bad::kZeroed);
}

// The open's own rewrite of a bad copy (sbfix40): a read-write open that found one copy of the superblock bad
// writes the good one over it (block 0 from the backup, or the backup from block 0) and syncs it. Each write and
// sync of that open (on a card closed cleanly: the rewrite's alone) cut by a power cut or a process crash, or
// failed, torn after each of kTears bytes (and none), and each sync failed then the power or the process gone: the
// card opens again read-only (nothing written) and read-write with the same objects, and that open leaves both
// copies the 4 KiB the format wrote (the same card id; no damage copied from the bad copy into the good one). Block
// 0 garbage (`offset` 0, kGarbage): every read-write open with restore_block_zero, as `verify --repair` (the only
// open that rewrites such a block 0); a read-only open may refuse it again as data of another kind (a cut inside
// the magic leaves such bytes).
void crash_copy_rewrite(uint64_t offset, Bad b) {
  const bool at0 = offset == 0, repair = at0 && (b == Bad::kGarbage || b == Bad::kTail);
  const std::string base = std::string("the rewrite of ") + (at0 ? "block 0 " : "the backup ") + bad_name(b);
  CardOptions rw = card_options(kRegionBytes);
  rw.format_blank = false;
  rw.restore_block_zero = repair;
  CardOptions ro = card_options(kRegionBytes);
  ro.format_blank = false;
  ro.read_only = true;
  // The open's writes and syncs, counted on a clean run: the rewrite's (one write at `offset`, one sync).
  uint64_t writes = 0, syncs = 0;
  bool at_offset = false;
  {
    auto image = used_card();
    damage(*image, offset, b);
    auto dev = std::make_unique<FaultDevice>(image, "rewrite-card");
    FaultDevice* d = dev.get();
    d->observe_writes([&at_offset, offset](uint64_t, uint64_t off, uint64_t) { at_offset |= off == offset; });
    std::unique_ptr<CardStore> s;
    Status st = CardStore::OpenDevice(std::move(dev), rw, &s);
    writes = d->writes();
    syncs = d->syncs_run();
    CHECK(st.ok() && stat(*s, "superblock_rewritten") == 1 && at_offset && writes >= 1 && syncs >= 1,
          "%s: a clean rewrite (%s; %" PRIu64 " writes, %" PRIu64 " syncs)", base.c_str(), st.message().c_str(), writes,
          syncs);
    if (!st.ok()) return;
  }
  enum Crash { kPowerCut, kProcessCrash, kFailedWrite, kFailedSyncCut, kFailedSyncCrash };
  struct Point {
    Crash crash;
    uint64_t n, tear;
  };
  std::vector<Point> points;
  for (uint64_t w = 0; w < writes; w++)
    for (Crash c : {kPowerCut, kProcessCrash, kFailedWrite}) {
      points.push_back({c, w, 0});
      for (uint64_t tear : kTears) points.push_back({c, w, tear});
    }
  for (uint64_t n = 0; n < syncs; n++) {
    points.push_back({kFailedSyncCut, n, 0});
    points.push_back({kFailedSyncCrash, n, 0});
  }
  static const char* const kCrashNames[] = {"power cut", "process crash", "failed write", "failed sync, power cut",
                                            "failed sync, process gone"};
  for (const Point& p : points) {
    runs++;
    const bool at_sync = p.crash == kFailedSyncCut || p.crash == kFailedSyncCrash;
    const std::string what = base + ": " + kCrashNames[p.crash] + " at the open's " + (at_sync ? "sync " : "write ") +
                             std::to_string(p.n) + (at_sync ? "" : " torn after " + std::to_string(p.tear) + " bytes");
    auto image = used_card();
    const std::vector<uint8_t> formatted(block_at(*image, 0), block_at(*image, 0) + kBlockSize);
    damage(*image, offset, b);
    {
      auto dev = damaged_device(image, offset, b);
      FaultDevice* d = dev.get();
      if (p.crash != kPowerCut && p.crash != kFailedSyncCut) d->keep_all_unsynced_at_cut();
      if (p.crash == kPowerCut || p.crash == kProcessCrash) d->cut_power_at_write(p.n, p.tear);
      if (p.crash == kFailedWrite) d->fail_write(p.n, p.tear);
      if (at_sync) d->fail_sync(p.n);
      std::unique_ptr<CardStore> s;
      Status st = CardStore::OpenDevice(std::move(dev), rw, &s);
      // The rewrite's failure is a WARNING: the card is served as opened.
      CHECK(st.ok() && stat(*s, "superblock_rewritten") == 0 && !s->superblock_rewrite_error().empty(),
            "%s: the open (%s)", what.c_str(), st.message().c_str());
      if (st.ok() && p.crash != kPowerCut && p.crash != kProcessCrash) check_objects(*s, what + ", the open");
      d->power_cut();  // the host or the process gone, as the crash says (a cut device: already dead)
      s.reset();
    }
    {
      const std::vector<uint8_t> before = image->data;
      std::unique_ptr<CardStore> s;
      Status st = CardStore::OpenDevice(std::make_unique<FaultDevice>(image, "rewrite-card"), ro, &s);
      CHECK(st.ok() || (repair && st.message().find("block 0 is not an ADP superblock") != std::string::npos),
            "%s: the read-only reopen: %s", what.c_str(), st.message().c_str());
      if (st.ok()) check_objects(*s, what + ", read-only");
      s.reset();
      CHECK(image->data == before, "%s: the read-only reopen wrote to the card", what.c_str());
    }
    std::unique_ptr<CardStore> s;
    Status st = CardStore::OpenDevice(std::make_unique<FaultDevice>(image, "rewrite-card"), rw, &s);
    CHECK(st.ok(), "%s: the reopen: %s", what.c_str(), st.message().c_str());
    if (!st.ok()) continue;
    check_objects(*s, what + ", the reopen");
    s.reset();
    CHECK(std::memcmp(block_at(*image, 0), formatted.data(), kBlockSize) == 0 &&
              std::memcmp(block_at(*image, kBackup), formatted.data(), kBlockSize) == 0,
          "%s: the reopen did not leave both copies the format's 4 KiB", what.c_str());
  }
}

// The backup's block refuses writes (review39b). A blank card is formatted with block 0 alone, as before session 39:
// the open succeeds, reports the backup bad, and the card works (before: the format failed, so did every open and
// `lmcache-adp format`: one bad block cost the card). Over a card whose backup is a card's superblock the format
// fails, nothing changed: block 0 new beside the old card's backup would open the old card once block 0 went bad.
void backup_unwritable() {
  runs++;
  {
    const std::string what = "a blank card whose backup block refuses writes";
    auto image = blank_image();
    std::unique_ptr<CardStore> s;
    Status st = CardStore::OpenDevice(damaged_device(image, kBackup, Bad::kUnreadableUnwritable),
                                      card_options(kRegionBytes), &s);
    CHECK(st.ok(), "%s: the open (format_blank) refused it: %s", what.c_str(), st.message().c_str());
    if (st.ok()) {
      CHECK(stat(*s, "superblock_backup_bad") == 1 && stat(*s, "superblock_block_zero_bad") == 0 &&
                stat(*s, "superblock_rewritten") == 0,
            "%s: the superblock stats do not say the backup is bad", what.c_str());
      IoContext ctx;
      const auto v = adp::testing::pattern(5000, 5);
      CHECK(put_one(*s, ctx, "stored", v).ok() && read_object(*s, ctx, "stored") == v, "%s: a store", what.c_str());
      s.reset();
      Superblock b0{};
      std::memcpy(&b0, block_at(*image, 0), sizeof b0);
      CHECK(adp::valid_superblock(b0), "%s: block 0 is not a superblock", what.c_str());
      FaultDevice* dev = nullptr;
      st = open_fault_card(image, card_options(kRegionBytes), &s, &dev);  // the block takes writes again
      CHECK(st.ok() && stat(*s, "superblock_rewritten") == 1 && read_object(*s, ctx, "stored") == v,
            "%s: the next open: %s", what.c_str(), st.message().c_str());
      CHECK(same_block(*image, 0, kBackup), "%s: the backup was not rewritten at the next open", what.c_str());
    }
  }
  {
    const std::string what = "a format over a card whose backup block (the card's superblock) refuses writes";
    auto image = used_card();
    const std::vector<uint8_t> before = image->data;
    FaultDevice writes_fail(image, "backup-card");
    writes_fail.fail_writes(kBackup, kBackup + kBlockSize);
    CHECK(!CardStore::FormatDevice(writes_fail, kRegionBytes).ok(), "%s: the format succeeded", what.c_str());
    CHECK(image->data == before, "%s: the failed format changed the card", what.c_str());
  }
}

void backup_superblock() {
  backup_unwritable();
  for (Bad b : {Bad::kZeroed, Bad::kTorn, Bad::kUnreadable, Bad::kUnreadableUnwritable, Bad::kTail}) one_copy_bad(0, b);
  foreign_block_zero(false);  // block 0 garbage: refused, opened by verify --repair's option (fd39)
  foreign_block_zero(true);
  for (Bad b : {Bad::kZeroed, Bad::kGarbage, Bad::kTorn, Bad::kUnreadable, Bad::kUnreadableUnwritable, Bad::kOtherCard,
                Bad::kTail})
    one_copy_bad(kBackup, b);
  older_layout_card();
  for (auto [offset, b] :
       {std::pair{uint64_t(0), Bad::kZeroed}, std::pair{uint64_t(0), Bad::kTorn}, std::pair{uint64_t(0), Bad::kGarbage},
        std::pair{uint64_t(0), Bad::kTail}, std::pair{kBackup, Bad::kZeroed}, std::pair{kBackup, Bad::kGarbage}})
    crash_copy_rewrite(offset, b);
  both_bad(Bad::kGarbage, Bad::kGarbage, "holds data that is not an ADP card");
  both_bad(Bad::kGarbage, Bad::kZeroed, "holds data that is not an ADP card");
  both_bad(Bad::kUnreadable, Bad::kZeroed, "cannot read the superblock");
  both_bad(Bad::kUnreadable, Bad::kUnreadable, "cannot read the superblock");
  both_bad(Bad::kTorn, Bad::kGarbage, "is torn");
  both_bad(Bad::kTorn, Bad::kTorn, "is torn");
  // A foreign block 0 beside another card's valid backup over a card with nothing stored: refused as every foreign
  // block 0 beside a valid backup is (fd39), naming the backup's card; nothing written.
  both_bad(Bad::kGarbage, Bad::kOtherCard, "block 0 is not an ADP superblock", false);
}
}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::one_argument(argc, argv, "DIR", &dir)) return 2;
  crash_every_point();
  std::vector<uint64_t> tears{0};
  tears.insert(tears.end(), std::begin(kTears), std::end(kTears));
  for (bool zero_region0 : {false, true})
    for (uint64_t tear : tears) {
      torn_format_over_data(0, tear, zero_region0, false);  // cut at the backup's write
      torn_format_over_data(1, tear, zero_region0, false);  // at block 0's: the backup opens the new card
      torn_format_over_data(1, tear, zero_region0, true);   // an older build's format: no backup
    }
  // The older build's runs torn after the new card id and before the superblock's end (67, 68, 71 bytes) are torn,
  // both ways: refused as before session 39 (no backup to open with).
  CHECK(torn_refused >= 4, "only %d runs left a torn superblock over data", torn_refused);
  image_files(dir);
  backup_superblock();
  std::printf("card_format_crash_test: %d runs, %d failures\n", runs, adp::testing::check_failures);
  return adp::testing::finish("card_format_crash_test");
}
