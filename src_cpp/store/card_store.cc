// SPDX-License-Identifier: Apache-2.0
// CardStore's open, format and lifecycle (Format, Open, the constructor and
// destructor, the torn-superblock check) and stats. Its other parts:
// card_store_reserve.cc (the frontier, eviction, settling), card_store_put.cc
// (the put path and tombstones), card_store_get.cc (the read path),
// card_store_remove.cc; what they share: card_store_internal.h. Recovery and
// verify are recovery.cc and verify.cc.
#include "store/card_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "store/card_store_internal.h"
#include "util/log.h"

namespace adp {

bool card_store_unwound() { return g_store_unwound.load(std::memory_order_acquire); }
int card_store_calls_on_this_thread() { return t_store_calls; }

namespace {

// Objects span regions (format 3), so the region size bounds no object and
// loses no tail: it is the unit of eviction. Many regions make eviction
// fine-grained (an eviction frees one region and drops at most the objects
// with bytes in it); each costs a 4 KiB header. So: about 128 regions that
// tile the data area (the leftover is under 128 x 4 KiB), 1 MiB to 256 MiB
// each (larger cards get more regions).
uint64_t default_region_bytes(uint64_t data_bytes) {
  constexpr uint64_t kTargetRegions = 128, kLargestDefault = 256u << 20;
  uint64_t n = std::max<uint64_t>(kTargetRegions, (data_bytes + kLargestDefault - 1) / kLargestDefault);
  uint64_t r = (data_bytes / n) & ~(kBlockSize - 1);
  return std::max(r, kMinRegionBytes);
}

// The index holds a region number in 20 bits (key_index.h): a card of more
// regions is refused, at format and at open.
static_assert(kMaxRegionBytes / kBlockSize < (1u << 17) && kMaxObjectBytes < (1u << 29), "index entry fields");
Status too_many_regions(const std::string& path, uint64_t regions) {
  return Status::InvalidArgument("card " + path + " has " + std::to_string(regions) + " regions; this build indexes " +
                                 std::to_string(kMaxIndexRegions) +
                                 " at most: format it with larger regions (region size at least its data bytes / " +
                                 std::to_string(kMaxIndexRegions) + ", up to 260 MiB), or use a smaller card");
}

// Whether any region header block of the card behind a torn superblock is not all zeros, *written: where a
// store ever began (a region is opened, its header written and synced, before anything is stored in it).
// The torn superblock's region size cannot be trusted, so the headers are looked at under each geometry the
// card can have: the one this open would format (`format_region_bytes`, 0: chosen from the size, as
// FormatDevice does) and the one the torn block names where it is a region size at all. Region 0's header
// (at kDataOffset) is in every geometry. 4 KiB reads, one a region (128 on a card of the default geometry).
Status region_written(Device& dev, const Superblock& torn, uint64_t format_region_bytes, AlignedBuffer& buf,
                      bool* written) {
  *written = false;
  const uint64_t size = dev.size() & ~(kBlockSize - 1);
  if (size < kDataOffset + kBlockSize) return Status::Ok();
  const uint64_t data_bytes = size - kDataOffset;
  const uint64_t geometries[2] = {format_region_bytes ? format_region_bytes : default_region_bytes(data_bytes),
                                  torn.region_bytes};
  for (uint64_t r : geometries) {
    if (r % kBlockSize || r < kMinRegionBytes || r > kMaxRegionBytes) continue;
    for (uint64_t i = 0; i == 0 || i < data_bytes / r; i++) {
      Status s = dev.read(kDataOffset + i * r, buf.data(), kBlockSize);
      if (!s.ok()) return s;
      if (!all_zero(buf.data(), kBlockSize)) {
        *written = true;
        return Status::Ok();
      }
    }
  }
  return Status::Ok();
}

// The refusal of a card whose block 0 holds readable bytes that are not a superblock of ours (not blank, not torn)
// while its backup superblock (`backup`, valid) names a card (fd39): damage to block 0, or another program's data
// written over the card (`parted mklabel`, an mkfs run on the card device by mistake). Which one cannot be told from
// the card, and the store never overwrites data that is not ours without the operator's command: every open refuses,
// writing nothing; `verify --repair` (CardOptions::restore_block_zero) rewrites block 0 from the backup.
Status foreign_block_zero(const std::string& path, const Superblock& backup) {
  char id[24];
  std::snprintf(id, sizeof id, "%016" PRIx64, backup.card_id);
  char geometry[512];
  std::snprintf(geometry, sizeof geometry, "%u regions of %.2f MiB, format version %u", backup.num_regions,
                backup.region_bytes / double(1u << 20), backup.format_version);
  return Status::InvalidArgument(
      "card " + path + ": block 0 is not an ADP superblock (it holds data of another kind), but the backup " +
      "superblock at offset " + std::to_string(kBackupSuperblockOffset) + " (1 MiB - 4 KiB) names card " + id + " (" +
      geometry +
      "). Either block 0 was damaged or another program wrote its data over the card (a partition table, a "
      "filesystem); nothing was written to it. If block 0 was damaged, `lmcache-adp verify --card " +
      path +
      " --repair` rewrites block 0 from the backup and opens the card with its objects; to use the device as a new "
      "card, `lmcache-adp format --card " +
      path + " --yes` (the cache on it is lost)");
}

// How the backup superblock's block compares with a valid block 0 (docs/card_format.md, "The backup superblock").
enum class BackupCopy {
  kSame,           // the same 4 KiB
  kBlank,          // all zeros: no backup yet (a card formatted by a build before session 39), not damage
  kBad,            // unreadable, damaged, or another superblock: `why` says which
  kBlockZeroTail,  // the same superblock, block 0's bytes after it damaged (not zeros), the backup's whole
};

// The backup's block (read as `read`, its bytes in `block`) against block 0's (`block0`, a valid superblock);
// *why: what is wrong with the backup (kBad), or with block 0 (kBlockZeroTail), for the WARNING and the stats.
// All zeros is taken for a card of an older build (it never writes 4 KiB..1 MiB, zeros on an image or a blank
// device): a backup zeroed by damage on a newer card reads the same, and is rewritten the same (block 0 is valid).
BackupCopy compare_backup(const Status& read, const uint8_t* block, const uint8_t* block0, std::string* why) {
  why->clear();
  if (!read.ok()) {
    *why = "cannot be read (" + read.message() + ")";
    return BackupCopy::kBad;
  }
  if (std::memcmp(block, block0, kBlockSize) == 0) return BackupCopy::kSame;
  if (all_zero(block, kBlockSize)) {
    *why = "is not written yet (zeros: a card formatted by an older build, before session 39)";
    return BackupCopy::kBlank;
  }
  constexpr size_t kSb = sizeof(Superblock);
  if (std::memcmp(block, block0, kSb) == 0) {
    // The same superblock: a tail damaged (a format writes zeros after the superblock in both copies).
    if (all_zero(block + kSb, kBlockSize - kSb)) {
      *why = "is damaged past its superblock (bytes " + std::to_string(kSb) +
             " to 4095 of block 0, zeros on a card, are not; its superblock and the backup are intact)";
      return BackupCopy::kBlockZeroTail;
    }
    *why = "is damaged past its superblock (bytes " + std::to_string(kSb) +
           " to 4095, zeros on a card, are not; the superblock in it is block 0's)";
    return BackupCopy::kBad;
  }
  Superblock b, b0;
  std::memcpy(&b, block, sizeof b);
  std::memcpy(&b0, block0, sizeof b0);
  if (valid_superblock(b) && b.card_id != b0.card_id) {
    char id[24];
    std::snprintf(id, sizeof id, "%016" PRIx64, b.card_id);
    *why = std::string("is another card's superblock (card ") + id +
           ": a format interrupted before its block 0, or one by an older build, which writes block 0 only)";
  } else if (valid_superblock(b)) {
    *why = "is a superblock of this card whose fields differ from block 0's (damaged)";
  } else if (torn_superblock(block)) {
    *why = "is damaged (it begins as a superblock but fails its checksum)";
  } else {
    *why = "is damaged (neither a superblock nor zeros)";
  }
  return BackupCopy::kBad;
}

}  // namespace

IoContext::~IoContext() = default;

Status CardStore::read_only_refusal(const char* what) const {
  return Status::InvalidArgument("cannot " + std::string(what) + " on card " + path() +
                                 ": it is open read-only (status, verify without --repair)");
}

Status CardStore::Format(const std::string& path, uint64_t create_bytes, uint64_t region_bytes,
                         bool create_preallocated) {
  std::unique_ptr<CardDevice> dev;
  Status s = CardDevice::Open(path, create_bytes, &dev, CardDevice::Access::kReadWrite,
                              create_preallocated ? CardDevice::Creation::kAllocated : CardDevice::Creation::kSparse);
  if (!s.ok()) return s;
  return FormatDevice(*dev, region_bytes);
}

Status CardStore::FormatDevice(Device& dev, uint64_t region_bytes) {
  const std::string& path = dev.path();
  uint64_t size = dev.size() & ~(kBlockSize - 1);
  // The device's own size in the message: a 1221-byte file read "has 0 bytes" (its whole blocks; audit 14).
  if (size < kDataOffset + kMinRegions * kMinRegionBytes)
    return Status::InvalidArgument("card " + path + " has " + std::to_string(dev.size()) + " bytes; at least " +
                                   std::to_string(kDataOffset + kMinRegions * kMinRegionBytes) + " are needed");
  uint64_t data_bytes = size - kDataOffset;
  if (region_bytes == 0) region_bytes = default_region_bytes(data_bytes);
  if (region_bytes % kBlockSize || region_bytes < kMinRegionBytes || region_bytes > kMaxRegionBytes ||
      data_bytes / region_bytes < kMinRegions)
    return Status::InvalidArgument(
        "region size " + std::to_string(region_bytes) +
        " is not a multiple of 4 KiB in [1 MiB, 260 MiB + 4 KiB] leaving at least 8 regions");

  if (data_bytes / region_bytes > kMaxIndexRegions) return too_many_regions(path, data_bytes / region_bytes);

  AlignedBuffer buf;
  if (!buf.reserve(kBlockSize)) return Status::IoError("out of memory", Status::IoClass::kGatewayMemory);
  // Whether the backup's block holds a card's superblock before this format (see below, at its write): read into
  // buf, before the new superblock is made there.
  bool backup_was_a_card = false;
  if (dev.read(kBackupSuperblockOffset, buf.data(), kBlockSize).ok()) {
    Superblock old{};
    std::memcpy(&old, buf.data(), sizeof old);
    backup_was_a_card = valid_superblock(old);
  }
  std::memset(buf.data(), 0, kBlockSize);
  Superblock sb{};
  std::memcpy(sb.magic, kSuperMagic, 8);
  sb.format_version = kFormatVersion;
  sb.block_size = kBlockSize;
  sb.card_bytes = size;
  sb.region_bytes = region_bytes;
  sb.num_regions = static_cast<uint32_t>(data_bytes / region_bytes);
  sb.max_key_bytes = kMaxKeyBytes;
  sb.data_offset = kDataOffset;
  std::random_device rd;
  sb.card_id = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(Clock::now().time_since_epoch().count());
  sb.created_unix = static_cast<uint64_t>(time(nullptr));
  sb.crc = superblock_crc(sb);
  std::memcpy(buf.data(), &sb, sizeof sb);
  // The backup first, written and synced, then block 0 (docs/card_format.md, "The backup superblock"): a crash
  // leaves block 0 as it was (blank, the old card's or torn: the backup, valid, is the new card's), or torn with
  // the new backup valid (the new card opens), or both new; never the old card's superblock in the backup with a
  // new block 0 (each open reads block 0 first anyway).
  // A backup whose write or sync fails (a block that refuses writes) fails the format only where that block held
  // a card's superblock before it (a card formatted since session 39): block 0 new beside it would let the old card
  // open again from it once block 0 went bad. Anywhere else (a blank card, one of an older build: zeros; damage;
  // unreadable) the card is formatted with block 0 alone, as before session 39, its open reporting the backup bad:
  // a bad block there costs no card.
  uint64_t mark = dev.write_mark();
  Status s = dev.write(kBackupSuperblockOffset, buf.data(), kBlockSize);
  if (s.ok()) s = dev.sync(mark);
  if (!s.ok() && !backup_was_a_card) {
    ADP_WARN("card %s: writing its backup superblock (offset %" PRIu64
             ") failed (%s); it held no card's superblock: formatting the card with block 0 alone (an open reports it "
             "bad, or not written yet where it reads as zeros, and rewrites it where it can)",
             path.c_str(), kBackupSuperblockOffset, s.message().c_str());
    s = Status::Ok();
  }
  if (s.ok()) {
    mark = dev.write_mark();
    s = dev.write(0, buf.data(), kBlockSize);
  }
  if (s.ok()) s = dev.sync(mark);
  if (s.ok())
    ADP_INFO("formatted card %s: %u regions of %.2f MiB", path.c_str(), sb.num_regions,
             region_bytes / double(1u << 20));
  return s;
}

CardStore::CardStore(std::unique_ptr<Device> dev, const Superblock& sb, bool durable, bool read_only)
    : device_(std::move(dev)),
      card_id_(sb.card_id),
      data_offset_(sb.data_offset),
      region_bytes_(sb.region_bytes),
      num_regions_(sb.num_regions),
      durable_(durable),
      read_only_(read_only),
      regions_(sb.num_regions) {}

CardStore::~CardStore() {
  // A clean close pads the frontier region's unwritten tail, as an open pads
  // a crash's cut (recovery.cc): the next open's walk then runs to the
  // region's end, finds no cut and writes nothing (an open after a clean
  // close leaves the card as it was). Not with a store unresolved or the
  // region broken: the walk ends in front of the tail there anyway.
  device_->stop_background();  // the pad below does not meet a prefault's piece
  if (read_only_ || !device_->healthy()) return;
  // Nothing throws out of here (session 28: a std::bad_alloc of the pad's list or its copy in pad_cuts ended the
  // process, std::terminate): without memory the pad is left to the next open, which pads the tail as a crash's
  // cut (it writes to the card then, where a clean close's open writes nothing).
  try {
    std::vector<Cut> tail;
    {
      std::lock_guard<std::mutex> flock(frontier_mu_);
      std::lock_guard<std::mutex> lock(mu_);
      if (frontier_ < 0 || !unresolved_.empty()) return;
      const RegionManager::Region& reg = regions_[static_cast<uint32_t>(frontier_)];
      if (reg.write_offset >= region_bytes_ || reg.broken_at != UINT64_MAX) return;
      tail.push_back({static_cast<uint32_t>(frontier_), reg.epoch, reg.write_offset, region_bytes_});
    }
    pad_cuts(tail, {});
  } catch (...) {
    try {
      ADP_ERROR("card %s: no memory to pad the frontier region's tail at close: the next open pads it", path().c_str());
    } catch (...) {
    }
  }
}

Status CardStore::Open(const CardOptions& opts, std::unique_ptr<CardStore>* out) {
  std::unique_ptr<CardDevice> dev;
  Status s =
      CardDevice::Open(opts.path, opts.create_bytes, &dev,
                       opts.read_only ? CardDevice::Access::kReadOnly : CardDevice::Access::kReadWrite,
                       opts.create_preallocated ? CardDevice::Creation::kAllocated : CardDevice::Creation::kSparse);
  if (!s.ok()) return s;
  dev->set_io_depth(opts.io_depth);
  if (opts.release_in_forked_child) dev->release_in_forked_child();
  // The prefault (a tmpfs card's mapping, in the background) starts once the
  // open is done: recovery's writes (the pads over a crash's cuts, the
  // tombstones) would wait behind it, ~50 ms on an 8 GiB card
  // (docs/card_format.md, Recovery), and the walk reads with preadv, not
  // through the mapping, so it gains nothing from it.
  CardDevice* card = dev.get();
  s = OpenDevice(std::move(dev), opts, out);
  if (s.ok()) card->start_prefault();  // *out owns it now
  return s;
}

Status CardStore::OpenDevice(std::unique_ptr<Device> dev, const CardOptions& opts, std::unique_ptr<CardStore>* out) {
  const std::string path = dev->path();
  // A file shorter than the superblock's block (an empty file an operator
  // made with `touch`, a short text file at a mistyped path) is no card and
  // cannot be formatted: its read failed "unexpected end of card" and the
  // message offered `format --yes`, which then refused it (audit 14).
  if (dev->size() < kBlockSize)
    return Status::InvalidArgument(
        "card " + path + " is a file of " + std::to_string(dev->size()) +
        " bytes: not an ADP card, and too small to be one (at least " +
        std::to_string(kDataOffset + kMinRegions * kMinRegionBytes) +
        " bytes); check the path, or remove the file and start again with a size (card_size_gb, --card-size-gb) "
        "to create a card image there");
  // backup_buf: 4 KiB, let go before recovery (which runs with room for little else: tests/store/test_no_thread.py).
  AlignedBuffer buf, backup_buf;
  if (!buf.reserve(kBlockSize) || !backup_buf.reserve_exact(kBlockSize))
    return Status::IoError("out of memory", Status::IoClass::kGatewayMemory);
  Superblock sb{};
  for (int attempt = 0; attempt < 2; attempt++) {
    // Both copies of the superblock (docs/card_format.md, "The backup superblock"): block 0 wins where it is
    // valid; where it is not and the backup is, the card opens with the backup.
    Status s = dev->read(0, buf.data(), kBlockSize);
    Status backup_read = dev->size() >= kDataOffset ? dev->read(kBackupSuperblockOffset, backup_buf.data(), kBlockSize)
                                                    : Status::IoError("the card ends before it");
    Superblock backup{};
    if (backup_read.ok()) std::memcpy(&backup, backup_buf.data(), sizeof backup);
    const bool backup_valid = backup_read.ok() && valid_superblock(backup);
    if (s.ok()) std::memcpy(&sb, buf.data(), sizeof sb);
    const bool block0_valid = s.ok() && valid_superblock(sb);
    std::string block0_bad;  // why block 0 is not used, the backup being used instead
    if (!block0_valid && backup_valid) {
      if (!s.ok())
        block0_bad = "cannot be read (" + s.message() + ")";
      else if (all_zero(buf.data(), kBlockSize))
        block0_bad = "is blank (zeros)";
      else if (torn_superblock(buf.data()))
        block0_bad = "is torn (it begins as a superblock but fails its checksum)";
      else if (!opts.restore_block_zero || opts.read_only)
        return foreign_block_zero(path, backup);  // damage or another program's data: the operator decides (fd39)
      else
        block0_bad =
            "is not an ADP superblock (it holds data of another kind): taken for damage at the operator's command "
            "(verify --repair), its bytes overwritten";
    }
    if (!block0_bad.empty()) {
      sb = backup;
      ADP_WARN(
          "card %s: its superblock (block 0, offset 0) %s; opening it with the backup superblock at offset %" PRIu64
          " (1 MiB - 4 KiB)%s",
          path.c_str(), block0_bad.c_str(), kBackupSuperblockOffset,
          opts.read_only ? " (a read-only open: block 0 not rewritten; a read-write open rewrites it)" : "");
    } else if (!s.ok()) {
      return Status::IoError("cannot read the superblock of card " + path + " (" + s.message() +
                             "); the card cannot be opened. Check the device; `lmcache-adp format --card " + path +
                             " --yes` reformats it (the cache on it is lost)");
    }
    if (block0_valid || !block0_bad.empty()) {
      if (sb.format_version < kOldestFormatVersion || sb.format_version > kFormatVersion)
        return Status::InvalidArgument(
            "card " + path + " has format version " + std::to_string(sb.format_version) +
            "; this build reads versions " + std::to_string(kOldestFormatVersion) + " to " +
            std::to_string(kFormatVersion) + ". The card holds a cache only: run `lmcache-adp format --card " + path +
            " --yes` to reformat it for this version (its cached objects are lost and will be stored again)");
      if (sb.region_bytes % kBlockSize)  // format makes 4 KiB blocks: a region that is not reads nowhere
        return Status::Corruption("superblock of card " + path + " gives a region size of " +
                                  std::to_string(sb.region_bytes) + " bytes, not a multiple of " +
                                  std::to_string(kBlockSize) + "; reformat with `lmcache-adp format --card " + path +
                                  " --yes`");
      if (sb.card_bytes > dev->size() || sb.block_size != kBlockSize || sb.data_offset != kDataOffset ||
          sb.region_bytes < kMinRegionBytes || sb.region_bytes > kMaxRegionBytes || sb.num_regions < 1 ||
          sb.data_offset + uint64_t(sb.num_regions) * sb.region_bytes > dev->size())
        return Status::Corruption("superblock of card " + path + " does not match the device (" +
                                  std::to_string(dev->size()) + " bytes); reformat with `lmcache-adp format --card " +
                                  path + " --yes`");
      if (sb.num_regions > kMaxIndexRegions) return too_many_regions(path, sb.num_regions);
      std::string copy_why;  // what compare_backup found wrong (the backup's, or block 0's tail)
      const BackupCopy copy = block0_bad.empty() ? compare_backup(backup_read, backup_buf.data(), buf.data(), &copy_why)
                                                 : BackupCopy::kSame;
      // Block 0's bytes past its superblock are not zeros, the backup the same superblock with zeros there: the card
      // opens with that superblock either way, and block 0 is the bad copy (the backup is not rewritten from it,
      // which would copy the bytes into it). Those bytes may be another program's (`parted mklabel` keeps a boot
      // sector's first 440 bytes, our superblock, and writes its partition table at 446 and a GPT header at 512), so
      // as for a block 0 of another kind (fd39) only restore_block_zero (`verify --repair`) rewrites block 0: any
      // other read-write open leaves it (review40: every read-write open rewrote it, the partition table lost).
      const bool tail_kept = copy == BackupCopy::kBlockZeroTail && !(opts.restore_block_zero && !opts.read_only);
      if (copy == BackupCopy::kBlockZeroTail) {
        block0_bad = copy_why;
        ADP_WARN("card %s: its superblock (block 0, offset 0) %s%s%s%s", path.c_str(), block0_bad.c_str(),
                 tail_kept
                     ? "; not rewritten: those bytes may be another program's data (a partition table) or damage, "
                       "which the card cannot tell apart. Check what is on the device; if block 0 was damaged, "
                       "`lmcache-adp verify --card "
                     : "",
                 tail_kept ? path.c_str() : "", tail_kept ? " --repair` rewrites it from the backup" : "");
      }
      std::unique_ptr<CardStore> store(new CardStore(std::move(dev), sb, opts.durable, opts.read_only));
      store->superblock_block_zero_bad_ = !block0_bad.empty();
      store->superblock_backup_bad_ = copy == BackupCopy::kBad;
      store->superblock_backup_blank_ = copy == BackupCopy::kBlank;
      // buf holds the good copy from here on (the one the card opened with), for rewrite_superblock_copy.
      if (!block0_bad.empty()) std::memcpy(buf.data(), backup_buf.data(), kBlockSize);
      AlignedBuffer().swap(backup_buf);
      s = store->recover(std::max(1, opts.recovery_threads));
      if (!s.ok()) return s;
      if (store->superblock_backup_bad_ && opts.read_only)
        ADP_WARN("card %s: its backup superblock (offset %" PRIu64
                 ") %s; a read-only open: not rewritten (a read-write open, or `lmcache-adp verify --repair`, "
                 "rewrites it from block 0)",
                 path.c_str(), kBackupSuperblockOffset, copy_why.c_str());
      if (store->superblock_backup_blank_ && opts.read_only)  // an older build's card: a note, not damage
        ADP_INFO("card %s: no backup superblock yet (offset %" PRIu64
                 "; a card formatted by an older build, before session 39): written at the next read-write open",
                 path.c_str(), kBackupSuperblockOffset);
      if (!opts.read_only && !tail_kept &&
          (store->superblock_block_zero_bad_ || store->superblock_backup_bad_ || store->superblock_backup_blank_))
        store->rewrite_superblock_copy(buf.data(), copy_why);
      *out = std::move(store);
      return Status::Ok();
    }
    const bool blank = all_zero(buf.data(), kBlockSize);
    if (!blank && !torn_superblock(buf.data()))
      return Status::InvalidArgument("card " + path +
                                     " holds data that is not an ADP card; refusing to overwrite it (use "
                                     "`lmcache-adp format --card " +
                                     path + "` to wipe it)");
    if (!blank) {
      // A format of this card did not finish (docs/card_format.md, Superblock: a torn superblock). Formatted
      // again only where nothing was ever stored on it: one whose regions were written (a card reformatted by
      // `lmcache-adp format` over its data, or one whose block 0 went bad) is not wiped by an open.
      bool written = false;
      s = region_written(*dev, sb, opts.region_bytes, buf, &written);
      if (!s.ok())
        return Status::IoError("card " + path + ": its superblock is torn and its region headers cannot be read (" +
                               s.message() + "); check the device; `lmcache-adp format --card " + path +
                               " --yes` reformats it (the cache on it is lost)");
      if (written)
        return Status::Corruption(
            "card " + path +
            ": its superblock (block 0) is torn: it begins as an ADP card's but fails its checksum (a format of it "
            "was interrupted, or block 0 was damaged), and its regions hold data; refusing to format it by itself. "
            "Run `lmcache-adp format --card " +
            path + " --yes` to format it (the cache on it is lost)");
      if (!opts.format_blank || opts.read_only)
        return Status::NotFound("no card at " + path +
                                " (its format was interrupted: block 0 holds a torn superblock and no region was "
                                "written); format it with `lmcache-adp format --card " +
                                path + "`");
      ADP_WARN(
          "card %s: its superblock is torn (a format of it was interrupted: a power cut or a crash) and no region of "
          "it was written: formatting it again",
          path.c_str());
    } else if (!opts.format_blank || opts.read_only) {
      return Status::NotFound("no card at " + path + " (block 0 is blank); format it with `lmcache-adp format --card " +
                              path + "`");
    }
    // Blank card, or one whose format did not finish: format it, then read the new superblock.
    s = FormatDevice(*dev, opts.region_bytes);
    if (!s.ok()) return s;
  }
  return Status::Corruption("card " + path + " could not be formatted");
}

void CardStore::rewrite_superblock_copy(const uint8_t* good, const std::string& backup_why) {
  // Block 0 bad: written from the backup; else the backup (bad or blank) from block 0. Its failure leaves the card
  // served as opened (a WARNING: the next open reads the good copy again); superblock_rewrite_error_ says what
  // failed where, for `verify --repair` to say (review39b: it named itself as the remedy).
  const bool block0 = superblock_block_zero_bad_;
  const uint64_t offset = block0 ? 0 : kBackupSuperblockOffset;
  const char* copy = block0 ? "superblock (block 0)" : "backup superblock";
  const uint64_t mark = device_->write_mark();
  Status s = device_->write(offset, good, kBlockSize);
  const bool wrote = s.ok();
  if (wrote) s = device_->sync(mark);
  superblock_rewritten_ = s.ok();
  if (!s.ok()) {
    superblock_rewrite_error_ = std::string(wrote ? "syncing" : "writing") + " its " + copy + " (" +
                                std::to_string(kBlockSize) + " bytes at offset " + std::to_string(offset) +
                                ") failed: " + s.message();
    ADP_WARN("card %s: %s: the card is served as opened; the next open reads the good copy again", path().c_str(),
             superblock_rewrite_error_.c_str());
  } else if (block0) {
    ADP_WARN("card %s: its superblock (block 0) rewritten from the backup superblock", path().c_str());
  } else if (superblock_backup_blank_) {
    ADP_INFO("card %s: its backup superblock (offset %" PRIu64
             ") written from block 0 (a card formatted by an older build had none)",
             path().c_str(), kBackupSuperblockOffset);
  } else {
    ADP_WARN("card %s: its backup superblock (offset %" PRIu64 ") %s: rewritten from block 0", path().c_str(),
             kBackupSuperblockOffset, backup_why.c_str());
  }
}

StoreStats CardStore::stats() const {
  StoreStats st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st.used_bytes = used_bytes_;
    st.objects = index_.size();
    st.free_regions = regions_.free_count();
    st.payload_bytes = payload_bytes_;
    st.first_eviction_held_bytes = first_eviction_.held_bytes;
    st.first_eviction_inflight_stores = first_eviction_.inflight;
    st.first_eviction_inflight_acked = first_eviction_.acked;
    st.first_eviction_inflight_failed = first_eviction_.failed;
    st.store_seqs_left = seqs_left();
    st.retired_regions = retired_regions_;
  }
  st.region_bytes = region_bytes_;
  st.num_regions = num_regions_;
  st.capacity_bytes = uint64_t(num_regions_) * region_bytes_;
  counters_.copy_to(&st);
  st.evicted_objects = counters_.evicted_objects;
  st.evicted_regions = counters_.evicted_regions;
  st.checksum_failures = counters_.checksum_failures;
  st.io_errors = counters_.io_errors;
  st.media_errors = counters_.media_errors;
  st.superblock_block_zero_bad = superblock_block_zero_bad_;
  st.superblock_backup_bad = superblock_backup_bad_;
  st.superblock_backup_blank = superblock_backup_blank_;
  st.superblock_rewritten = superblock_rewritten_;
  st.region_waits = counters_.region_waits;
  st.writes_overlapped = counters_.writes_overlapped;
  st.memory_failures = counters_.memory_failures;
  st.recovered_objects = recovered_objects_;
  st.recovery_seconds = recovery_seconds_;
  st.recovery_damaged_regions = damaged_regions_;
  st.recovery_lost_objects = damage_lost_objects_;
  st.recovery_lost_bytes = damage_lost_bytes_;
  st.recovery_seq_margin = recovery_seq_margin_;
  st.healthy = device_->healthy();
  return st;
}

}  // namespace adp
