// SPDX-License-Identifier: Apache-2.0
#include "store/card_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <exception>
#include <optional>
#include <random>
#include <thread>
#include <tuple>

#include "store/index_hash.h"
#include "util/crc32c.h"
#include "util/load_profile.h"
#include "util/log.h"
#include "util/scope_exit.h"

namespace adp {

namespace {
std::atomic<bool> g_store_unwound{false};
thread_local int t_store_calls = 0;

// Inside a card store operation for a scope; an exception that leaves it marks the store unwound.
class StoreCall {
 public:
  StoreCall() : uncaught_(std::uncaught_exceptions()) { t_store_calls++; }
  ~StoreCall() {
    t_store_calls--;
    if (std::uncaught_exceptions() > uncaught_) g_store_unwound.store(true, std::memory_order_release);
  }
  StoreCall(const StoreCall&) = delete;
  StoreCall& operator=(const StoreCall&) = delete;

 private:
  const int uncaught_;
};
}  // namespace

bool card_store_unwound() { return g_store_unwound.load(std::memory_order_acquire); }
int card_store_calls_on_this_thread() { return t_store_calls; }
namespace {

// On a memory-speed card, loads read straight into the caller's buffer and
// stores write straight from it in pieces of this size, each checksummed
// while it is in the CPU's cache (L2), so the CRC adds no pass over memory.
constexpr size_t kPieceBytes = 1u << 20;

// A store from a fill (PutItem::fill) asks it for pieces of this size and
// checksums each where it landed, before the next: the CRC's second read of
// the piece then comes from the L2 cache. One-thread probe on this VM (2 MiB
// L2 a core; results/2026-12-01-1314-put-pointer-ab-vm.md): memcpy fills ran
// at 0.94-1.0x of the pointer path's fused copy-and-CRC with 256 KiB pieces,
// 0.82-0.90x with 1 MiB; process_vm_readv runs as fast in 256 KiB pieces as
// in 1 MiB ones (raw/2026-12-01-1300-process-vm-limit-16core.txt).
constexpr size_t kFillPieceBytes = 256u << 10;

// On a disk card, an object from 4 KiB-aligned memory at least this large has
// its CRC computed on the IoContext's CrcWorker while its body is written (the
// header, which carries the CRC, follows as a second I/O). Smaller objects
// go in one I/O, CRC first: there the extra I/O would cost more than the CRC
// (15 GiB/s: 2 ms per 32 MiB, 0.13 ms per 2 MiB).
constexpr size_t kOverlapCrcBytes = 1u << 20;
// A kPieces load (a disk card) reads straight into the caller's buffer in
// pieces of this size, asking the caller's guard before each: the time a
// load can go on writing after its caller gave up is one piece's read. Large
// enough to keep the device's request size (4 MiB on this VM's virtio disk:
// /sys/block/*/queue/max_sectors_kb), small enough that the CRC of a piece
// runs while it is still in the CPU's last-level cache.
constexpr size_t kGuardedPieceBytes = 4u << 20;

using Clock = std::chrono::steady_clock;

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

// A failure for want of this process's memory whose making allocates nothing (its message fits std::string's
// own buffer): what a store operation reports where an allocation threw (std::bad_alloc) part way, the change
// it had begun undone (session 26).
Status no_memory() { return Status::IoError("out of memory", Status::IoClass::kGatewayMemory); }

// Room for one more element in v, grown geometrically (reserve(size + 1) would copy it on every push).
template <typename T>
void room_for_one(std::vector<T>& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(8, v.capacity() * 2));
}

bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::all_of(b, b + n, [](uint8_t c) { return c == 0; });
}

// Whether block 0 (not a valid superblock) is one of ours that a format did not finish writing (session 30:
// a power cut or a crash inside the format of a blank card left a torn superblock, and every later open refused
// the card as "data that is not an ADP card", for good): it begins with the magic (the write torn after it, the
// CRC then fails), or with a part of the magic and nothing but zeros after it (torn inside it, over a blank
// block 0). Anything else is foreign.
bool torn_superblock(const uint8_t* block) {
  if (std::memcmp(block, kSuperMagic, sizeof kSuperMagic) == 0) return true;
  size_t n = 0;
  while (n < sizeof kSuperMagic && block[n] == static_cast<uint8_t>(kSuperMagic[n])) n++;
  return n > 0 && all_zero(block + n, kBlockSize - n);
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
  const uint64_t mark = dev.write_mark();
  Status s = dev.write(0, buf.data(), kBlockSize);
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
      tail.push_back({static_cast<uint32_t>(frontier_), reg.epoch, reg.write_offset});
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
  AlignedBuffer buf;
  if (!buf.reserve(kBlockSize)) return Status::IoError("out of memory", Status::IoClass::kGatewayMemory);
  Superblock sb{};
  for (int attempt = 0; attempt < 2; attempt++) {
    Status s = dev->read(0, buf.data(), kBlockSize);
    if (!s.ok())
      return Status::IoError("cannot read the superblock of card " + path + " (" + s.message() +
                             "); the card cannot be opened. Check the device; `lmcache-adp format --card " + path +
                             " --yes` reformats it (the cache on it is lost)");
    std::memcpy(&sb, buf.data(), sizeof sb);
    if (valid_superblock(sb)) {
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
      std::unique_ptr<CardStore> store(new CardStore(std::move(dev), sb, opts.durable, opts.read_only));
      s = store->recover(std::max(1, opts.recovery_threads));
      if (!s.ok()) return s;
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

bool CardStore::extents_locked(uint32_t region, uint64_t offset, uint64_t footprint, std::vector<Extent>* ext,
                               std::vector<uint32_t>* regions) const {
  ext->clear();
  regions->clear();
  return for_each_part_locked(region, offset, footprint, [&](uint32_t r, uint64_t len, uint64_t at) {
    ext->push_back({at, len});
    regions->push_back(r);
  });
}

void CardStore::unaccount_locked(const IndexEntry& e) {
  uint64_t fp = object_footprint(e.payload_bytes);
  for_each_part_locked(e.region, uint64_t(e.block) * kBlockSize, fp,
                       [this](uint32_t r, uint64_t len, uint64_t) { regions_[r].live_bytes -= len; });
  used_bytes_ -= fp;
  payload_bytes_ -= e.payload_bytes;
}

void CardStore::erase_entry_locked(uint64_t hash, const IndexEntry& e) {
  // A store of this key reserved before e's (a lower seq) and still in flight must not be indexed when it commits:
  // e's commit marked the key's older copies deleted with their own seqs, and those tombstones stay on the card
  // when e leaves the index. Indexed, that store would be acknowledged and held, and lost at the next open (a
  // tombstone of a higher seq outranks it). Until session 30 it was: card_crash_mt_test, a store reserved first
  // and committed last, after the newer copy had been evicted (a power cut then lost a key the store held).
  for (auto& [ticket, f] : inflight_)
    if (f.hash == hash && f.seq < e.seq) f.outranked = true;
  unaccount_locked(e);
  index_.erase(hash);
}

void CardStore::evict_locked(uint32_t r) {
  RegionManager::Region& reg = regions_[r];
  uint64_t evicted = 0;
  for (uint64_t h : reg.hashes) {
    auto it = index_.find(h);
    if (it == index_.end()) continue;
    // The key's current copy may live elsewhere (superseded since): only a
    // copy with bytes in r goes, whether it starts in r or continues into it.
    bool touches = false;
    for_each_part_locked(it->second.region, uint64_t(it->second.block) * kBlockSize,
                         object_footprint(it->second.payload_bytes),
                         [&](uint32_t part, uint64_t, uint64_t) { touches |= part == r; });
    if (touches) {
      if (!first_eviction_.taken) note_first_eviction_locked();
      erase_entry_locked(h, it->second);
      evicted++;
    }
  }
  reg.hashes.clear();
  reg.hashes.shrink_to_fit();
  if (evicted) {
    counters_.evicted_objects += evicted;
    counters_.evicted_regions++;
    if (!evicting_logged_) {
      evicting_logged_ = true;
      ADP_INFO("card %s is full: evicting least recently used regions", path().c_str());
    }
  }
}

void CardStore::note_first_eviction_locked() {
  // The store whose reservation evicts has no ticket yet: it is not counted
  // (it does not fit without the eviction).
  // What may throw (the map of counted keys) is made first: an allocation that fails leaves nothing taken.
  FirstEviction& f = first_eviction_;
  decltype(f.counted) counted;
  for (const auto& [ticket, s] : inflight_) {
    auto it = index_.find(s.hash);
    uint64_t seq = 0, bytes = 0;
    if (it != index_.end()) seq = it->second.seq, bytes = it->second.payload_bytes;
    counted.try_emplace(s.hash, seq, bytes);
  }
  f.counted = std::move(counted);
  f.taken = true;
  f.held_bytes = payload_bytes_;
  for (auto& [ticket, s] : inflight_) {
    s.at_first_eviction = true;
    f.inflight++;
  }
}

void CardStore::settle_locked(uint64_t ticket, bool acked) {
  auto it = inflight_.find(ticket);
  if (it == inflight_.end()) return;
  const InFlight s = it->second;
  inflight_.erase(it);
  if (!s.at_first_eviction) return;
  FirstEviction& f = first_eviction_;
  if (!acked) {
    f.failed++;
  } else {
    f.acked++;
    // A key counts once, at its newest acknowledged copy: one held then, or
    // a store of it in flight then.
    // Every key in flight then was counted (note_first_eviction_locked): found, never inserted (no allocation).
    auto c = f.counted.find(s.hash);
    if (c == f.counted.end()) return;
    auto& [seq, bytes] = c->second;
    if (s.seq > seq) {
      f.held_bytes = f.held_bytes - bytes + s.payload_bytes;
      seq = s.seq;
      bytes = s.payload_bytes;
    }
  }
  if (f.acked + f.failed == f.inflight) f.counted = {};
}

Status CardStore::advance_frontier(IoContext& ctx, std::unique_lock<std::mutex>& lock, uint64_t cont_bytes,
                                   uint32_t* region) {
  uint32_t r;
  auto deadline = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    if (regions_.take_free(&r)) break;
    int64_t victim = regions_.choose_victim();
    if (victim >= 0) {
      r = static_cast<uint32_t>(victim);
      evict_locked(r);
      break;
    }
    if (unpinned_.wait_until(lock, deadline) == std::cv_status::timeout)
      return Status::NoSpace("card " + path() + " is full and every region is being written or read");
  }
  uint64_t epoch = regions_.open(r, kBlockSize);
  uint32_t prev = frontier_ >= 0 ? static_cast<uint32_t>(frontier_) : kNoRegion;
  uint64_t prev_epoch = frontier_ >= 0 ? regions_[prev].epoch : 0;
  lock.unlock();
  encode_region_header(ctx.header_.data(), card_id_, epoch, r, prev, prev_epoch, cont_bytes);
  const uint64_t mark = device_->write_mark();
  Status s;
  try {
    s = device_->write(region_offset(r), ctx.header_.data(), kBlockSize);
    // The new epoch must be on the card before anything is written under it:
    // after a power cut that lost it, the epoch could be handed out again and
    // unsynced leftovers written under it would walk as a valid chain.
    if (s.ok() && durable_) s = device_->sync(mark);
  } catch (const std::bad_alloc&) {
    s = no_memory();  // the region goes back below (it was taken, and is neither free nor the frontier)
  }
  lock.lock();
  if (!s.ok()) {
    count_failure(s);
    regions_.fail_open(r);  // other regions are tried before this one again
    return s;
  }
  if (frontier_ >= 0) {
    regions_[prev].next = r;
    regions_[prev].next_epoch = epoch;
    regions_.seal(prev);
  }
  frontier_ = r;
  regions_[r].write_offset = kBlockSize + cont_bytes;
  regions_[r].open_mark = mark;
  *region = r;
  return Status::Ok();
}

Status CardStore::reserve(IoContext& ctx, uint64_t hash, uint64_t payload_bytes, Placement* pl) {
  const uint64_t footprint = object_footprint(payload_bytes);
  // Everything a reservation allocates is made before it takes anything (session 26): the placement's room for
  // every region it may span, the nodes of its ticket and of its in-flight entry (inserted below without
  // allocating). A std::bad_alloc here leaves the store unchanged.
  const size_t most = 2 + footprint / (region_bytes_ - kBlockSize);
  pl->regions.reserve(most);
  pl->ext.reserve(most);
  decltype(unresolved_)::node_type ticket_node;
  decltype(inflight_)::node_type inflight_node;
  {
    decltype(unresolved_) t{0};
    ticket_node = t.extract(t.begin());
    decltype(inflight_) f{{0, InFlight{hash, payload_bytes, 0}}};
    inflight_node = f.extract(f.begin());
  }
  std::lock_guard<std::mutex> flock(frontier_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  // An index entry holds a seq in 46 bits: past it a store would be indexed
  // under its seq cut short, its load would miss (the card's seq differs) and
  // the older copy it supersedes be marked deleted. Refused instead.
  if (next_seq_ > kMaxIndexSeq)
    return Status::NoSpace("card " + path() + ": its store sequence numbers are spent (over 2^46); reformat it");
  uint32_t f;
  // A failed sync since the frontier region was opened may have lost a write
  // in it for good (a record, a pad: a hole that recovery's walk stops at),
  // and its stores are failed for it (their sync is given its open_mark):
  // the frontier moves on, as past a pad that could not be written.
  if (frontier_ >= 0 && device_->lost_after(regions_[frontier_].open_mark))
    regions_[frontier_].write_offset = region_bytes_;
  if (frontier_ < 0 || regions_[frontier_].write_offset >= region_bytes_) {
    Status s = advance_frontier(ctx, lock, 0, &f);
    if (!s.ok()) return s;
  }
  f = static_cast<uint32_t>(frontier_);
  RegionManager::Region& head = regions_[f];
  pl->region = f;
  pl->offset = head.write_offset;
  pl->epoch = head.epoch;
  pl->since = head.open_mark;
  pl->regions.assign(1, f);
  pl->ext.assign(1, Extent{region_offset(f) + pl->offset, std::min(footprint, region_bytes_ - pl->offset)});
  regions_.pin(f);
  regions_.touch(f);  // a sealed region's LRU age is its last write
  uint64_t rem = footprint - pl->ext[0].len;
  head.write_offset += pl->ext[0].len;
  // The record continues into as many new regions as it needs; each one's
  // header says how many of its bytes belong to this record.
  while (rem) {
    uint64_t take = std::min(rem, region_bytes_ - kBlockSize);
    uint32_t r;
    Status s;
    try {
      s = advance_frontier(ctx, lock, take, &r);
    } catch (const std::bad_alloc&) {  // its refusal's message: the regions taken so far go back as below
      if (!lock.owns_lock()) lock.lock();
      s = no_memory();
    }
    if (!s.ok()) {
      for (uint32_t p : pl->regions)
        if (regions_.unpin(p)) unpinned_.notify_all();
      return s;
    }
    regions_.pin(r);
    pl->regions.push_back(r);
    pl->ext.push_back({region_offset(r) + kBlockSize, take});
    rem -= take;
  }
  pl->seq = next_seq_++;
  pl->ticket = next_ticket_++;
  ticket_node.value() = pl->ticket;
  unresolved_.insert(std::move(ticket_node));
  inflight_node.key() = pl->ticket;
  inflight_node.mapped().seq = pl->seq;
  inflight_.insert(std::move(inflight_node));
  return Status::Ok();
}

Status CardStore::io_mapped(bool write, const std::vector<Extent>& ext, uint64_t logical, const iovec* iov, int n) {
  uint64_t total = 0;
  for (int i = 0; i < n; i++) total += iov[i].iov_len;
  const uint64_t end = logical + total;
  uint64_t pos = logical, ext_begin = 0;
  int vi = 0;
  size_t voff = 0;
  // A read that runs from the end of one region into the next region on the
  // card (the write frontier took them in order, as on a new card) is one
  // request, that region's header block read into a scratch block between:
  // a 32 MiB object in 64 MiB regions spans two every other time, and its
  // second request (the object's last few KiB) waited ~33 ms in this VM's
  // disk queue behind the other workers' reads (strace,
  // benchmarks/results/2026-12-04-*-oneread.md). Writes never cover a header.
  // A write is one request a region, issued last region first: a record's
  // header is in its first region, so a process that dies between them
  // leaves no header over a continuation that never landed (a newer copy
  // torn there would outrank the older copy of its key, and both be lost).
  thread_local AlignedBuffer gap;
  std::vector<iovec> sub;
  uint64_t sub_at = 0, sub_end = 0;  // the card's bytes [sub_at, sub_end) that sub reads or writes
  // A write's requests before its last, in the record's order (none for a record in one region).
  std::vector<std::pair<uint64_t, std::vector<iovec>>> earlier;
  auto flush = [&](bool last) -> Status {
    if (sub.empty()) return Status::Ok();
    if (write && !last) {
      earlier.emplace_back(sub_at, std::move(sub));
      sub.clear();
      return Status::Ok();
    }
    Status s = write ? device_->writev(sub_at, sub.data(), static_cast<int>(sub.size()))
                     : device_->readv(sub_at, sub.data(), static_cast<int>(sub.size()));
    sub.clear();
    return s;
  };
  for (const Extent& x : ext) {
    uint64_t ext_end = ext_begin + x.len;
    if (pos < ext_end && pos < end) {
      uint64_t stop = std::min(ext_end, end), need = stop - pos;
      const uint64_t at = x.at + (pos - ext_begin);
      if (!write && !sub.empty() && at == sub_end + kBlockSize && gap.reserve(kBlockSize)) {
        sub.push_back({gap.data(), kBlockSize});
      } else {
        Status s = flush(false);
        if (!s.ok()) return s;
        sub_at = at;
      }
      while (need) {
        size_t avail = iov[vi].iov_len - voff, t = std::min<uint64_t>(avail, need);
        if (t) sub.push_back({static_cast<uint8_t*>(iov[vi].iov_base) + voff, t});
        need -= t;
        voff += t;
        if (voff == iov[vi].iov_len) vi++, voff = 0;
      }
      sub_end = at + (stop - pos);
      pos = stop;
    }
    ext_begin = ext_end;
  }
  if (pos != end) return Status::IoError("record extent beyond its placement");
  Status s = flush(true);
  for (auto w = earlier.rbegin(); s.ok() && w != earlier.rend(); ++w)
    s = device_->writev(w->first, w->second.data(), static_cast<int>(w->second.size()));
  return s;
}

void CardStore::resolve(uint64_t ticket, bool failed) {
  std::lock_guard<std::mutex> lock(mu_);
  unresolved_.erase(ticket);
  if (failed) settle_locked(ticket, false);
  resolved_.notify_all();
}

void CardStore::abandon(IoContext& ctx, const Placement& pl, uint64_t payload_bytes) {
  // A pad over the record's header block lets recovery step over the hole
  // to the stores reserved after it.
  encode_pad(ctx.header_.data(), card_id_, pl.epoch, payload_bytes, continues(pl.offset, payload_bytes));
  Status s;
  try {
    s = device_->write(pl.ext[0].at, ctx.header_.data(), kBlockSize);
  } catch (const std::bad_alloc&) {
    s = no_memory();  // not marked: the region broken there, as below
  }
  if (s.ok()) return;
  count_failure(s);
  // Recovery's walk of the region will stop here: no store behind this
  // place in the region may be acknowledged, and the frontier moves on.
  // (mu_ only: a reservation holding frontier_mu_ may be waiting for a
  // region that a store waiting for this ticket has pinned.)
  std::lock_guard<std::mutex> lock(mu_);
  RegionManager::Region& reg = regions_[pl.region];
  if (reg.epoch != pl.epoch) return;
  reg.broken_at = std::min(reg.broken_at, pl.offset);
  if (frontier_ == static_cast<int64_t>(pl.region)) reg.write_offset = region_bytes_;
}

void CardStore::put(IoContext& ctx, const PutItem* items, size_t n, Status* results,
                    const std::function<bool()>& still_wanted) {
  std::optional<bool> asked;  // one caller: asked once
  put_each(ctx, items, n, results, [&](size_t) {
    if (!asked) asked = still_wanted();
    return *asked;
  });
}

void CardStore::put_each(IoContext& ctx, const PutItem* items, size_t n, Status* results,
                         const std::function<bool(size_t item)>& item_wanted) {
  const StoreCall call;
  const Foreground busy = device_->begin_foreground();
  ctx.store_ = this;
  if (read_only_) {
    for (size_t i = 0; i < n; i++) results[i] = read_only_refusal("store");
    return;
  }
  if (!ctx.header_.reserve(2 * kBlockSize)) {
    for (size_t i = 0; i < n; i++)
      results[i] = Status::IoError("out of memory for staging", Status::IoClass::kGatewayMemory);
    counters_.store_failures += n;
    counters_.memory_failures += n;
    return;
  }
  retry_pending(ctx);
  std::vector<Location> written;  // parallel to items; region == UINT32_MAX if not written
  written.resize(n, Location{UINT32_MAX, 0, 0, 0, 0});
  std::vector<uint64_t> tickets(n, 0);  // of the written ones
  // Items whose fill failed: their source's failure (the caller answers for
  // it), not counted in store_failures (review r9 S2).
  std::vector<uint8_t> source_failed(n, 0);
  // Regions holding this put's objects stay pinned until the commit: a
  // sealed region would otherwise look empty and be evicted (and rewritten)
  // before its objects are indexed.
  std::vector<uint32_t> pinned;
  std::vector<uint8_t> settled(n, 0);  // 1: the written item's store was acknowledged or failed (settle_locked)
  std::vector<uint8_t> wanted(n, 0);
  // Tombstones due (older copies, voids), their regions pinned: at most one an item, so pushed without allocating.
  std::vector<Stale> stale;
  stale.reserve(n);
  // Room in pending_ for every tombstone and void this put may leave there, one an item (a void of its copy, or the
  // tombstone of what it replaces or of itself): held before anything is written, so none is ever dropped for want
  // of memory (session 27); given back by write_tombstones, or by the undo below.
  size_t held = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      hold_pending_room_locked(n);
      held = n;
    } catch (const std::bad_alloc&) {  // refused as for want of staging: nothing written, nothing held
    }
  }
  if (held < n) {
    for (size_t i = 0; i < n; i++) results[i] = no_memory();
    counters_.store_failures += n;
    counters_.memory_failures += n;
    return;
  }
  bool unpinned = false, stale_handed = false;
  // An exception (std::bad_alloc) past here leaves the store as if this put had failed (session 26): every item
  // written and not yet acknowledged is failed (no longer in flight) and its copy, on the card but never indexed,
  // is voided as a copy not wanted is (a tombstone of seq 0, pending: retried by the next store or delete, which is
  // refused for that key until it is on the card); the regions this put pinned are unpinned, and the tombstones it
  // had queued go to pending_ unwritten (their guards kept pinned). Until session 27 such a copy was left unvoided
  // and the queued tombstones were dropped: the copy's seq outranked a later delete's tombstone (or no delete found
  // it to mark), and the key deleted came back at the next open. Each step allocates nothing (pending_room_). A
  // failure inside one item's write is no exception out of put: that item fails (out of memory), as a failed
  // write does, and the rest go on.
  ScopeExit undo([&] {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; i++)
      if (written[i].region != UINT32_MAX && !settled[i]) {
        settle_locked(tickets[i], false);
        Location& loc = written[i];  // its key (maybe not copied) is the one its header holds: write_tombstone
        loc.seq = 0;
        pending_.push_back({std::move(loc), {}, {}});  // room held: no allocation
      }
    if (!unpinned)
      for (uint32_t r : pinned)
        if (regions_.unpin(r)) unpinned_.notify_all();
    if (!stale_handed) pend_stale_locked(stale);
    pending_room_ -= held;
    pending_count_ = pending_.size();
  });
  uint64_t last_ticket = 0;
  bool any_written = false;
  // The oldest open_mark of the regions this put's records start in: its sync fails where a failed sync since may
  // have lost one of its writes, or one they depend on (a record or pad in front of one of them).
  uint64_t since = UINT64_MAX;
  Placement pl;
  for (size_t i = 0; i < n; i++) {
    const PutItem& it = items[i];
    results[i] = check_key(it.key);
    if (!results[i].ok()) continue;
    if (it.size > max_object_bytes()) {
      if (!oversize_logged_.exchange(true))
        ADP_ERROR("card %s refuses objects larger than %" PRIu64 " bytes (%s); got one of %zu bytes%s", path().c_str(),
                  max_object_bytes(), max_object_bound().c_str(), it.size,
                  max_object_bytes() == kMaxObjectBytes ? "" : ": format a larger card");
      results[i] = Status::NoSpace("object of " + std::to_string(it.size) +
                                   " bytes is larger than the largest object the card " + path() + " holds (" +
                                   std::to_string(max_object_bytes()) + " bytes: " + max_object_bound() + ")");
      continue;
    }
    const uint64_t fp = object_footprint(it.size), hash = index_hash(it.key);
    // Zero-copy when the caller's memory suits O_DIRECT: header block, the
    // aligned body straight from the caller, the tail through a block of ours.
    // Otherwise the whole object is staged.
    const bool filled = static_cast<bool>(it.fill);
    bool aligned = !filled && (reinterpret_cast<uintptr_t>(it.data) % kBlockSize) == 0 && it.size >= kBlockSize;
    if (!filled && !aligned && !ctx.staging_.reserve(fp)) {
      results[i] = Status::IoError("out of memory for staging", Status::IoClass::kGatewayMemory);
      continue;
    }
    pinned.reserve(pinned.size() + 2 + fp / (region_bytes_ - kBlockSize));  // the regions it may span
    Status s;
    try {
      s = reserve(ctx, hash, it.size, &pl);  // a std::bad_alloc leaves nothing reserved
    } catch (const std::bad_alloc&) {
      s = no_memory();
    }
    if (!s.ok()) {
      results[i] = s;
      continue;
    }
    pinned.insert(pinned.end(), pl.regions.begin(), pl.regions.end());  // room made above: no allocation
    last_ticket = pl.ticket;
    const uint64_t epoch = pl.epoch, seq = pl.seq;
    const uint32_t flags = continues(pl.offset, it.size) ? uint32_t(kObjectContinues) : 0u;
    bool card_error = true;  // false: the fill (the source) failed, or staging memory
    try {  // a std::bad_alloc while it is written fails the item (its place abandoned), as a failed write does
      iovec iov[3];
      int iovcnt = 0;
      bool mapped = device_->mapped() != nullptr;
      for (const Extent& x : pl.ext) mapped = mapped && device_->prepare_mapped_write(x.at, x.len);
      if (filled) {
        bool fill_failed = false;
        s = write_filled(ctx, pl.ext, it, epoch, seq, flags, mapped, &card_error, &fill_failed);
        source_failed[i] = fill_failed;
      } else if (mapped || (aligned && device_->memory_backed())) {
        s = write_in_pieces(ctx, pl.ext, it, epoch, seq, flags, mapped);
      } else if (aligned && it.size >= kOverlapCrcBytes) {
        s = write_body_then_header(ctx, pl, it, epoch, seq, flags);
      } else if (aligned) {
        uint32_t pcrc = crc32c(it.data, it.size);
        uint8_t* hdr = ctx.header_.data();
        encode_object_header(hdr, card_id_, epoch, seq, it.key, it.size, pcrc, flags);
        size_t body = it.size & ~(kBlockSize - 1), tail = it.size - body;
        iov[0] = {hdr, kBlockSize};
        iov[1] = {const_cast<uint8_t*>(it.data), body};
        iovcnt = 2;
        if (tail) {
          uint8_t* tb = hdr + kBlockSize;
          std::memcpy(tb, it.data + body, tail);
          std::memset(tb + tail, 0, kBlockSize - tail);
          iov[iovcnt++] = {tb, kBlockSize};
        }
      } else {
        uint8_t* st = ctx.staging_.data();
        uint32_t pcrc = crc32c_copy(st + kBlockSize, it.data, it.size);  // stage and checksum in one pass
        encode_object_header(st, card_id_, epoch, seq, it.key, it.size, pcrc, flags);
        std::memset(st + kBlockSize + it.size, 0, fp - kBlockSize - it.size);
        iov[0] = {st, fp};
        iovcnt = 1;
      }
      if (iovcnt) s = io_mapped(true, pl.ext, 0, iov, iovcnt);
    } catch (const std::bad_alloc&) {
      s = no_memory();
      card_error = false;
    } catch (...) {  // another (a fill's own): its place abandoned, its ticket resolved, then it goes on (undo)
      abandon(ctx, pl, it.size);
      resolve(pl.ticket, true);
      throw;
    }
    if (!s.ok()) {
      if (card_error) count_failure(s);
      abandon(ctx, pl, it.size);
      resolve(pl.ticket, true);
      results[i] = s;
      continue;
    }
    resolve(pl.ticket, false);
    counters_.bytes_written += fp;
    written[i] = {pl.region, pl.offset, epoch, seq, it.size, hash};  // its key copied only for a tombstone (keyed)
    tickets[i] = pl.ticket;
    any_written = true;
    since = std::min(since, pl.since);
  }
  if (any_written) {
    // Every store reserved before this put's last one must be on the card
    // (or marked abandoned) first: recovery walks a region up to its first
    // hole, so a store behind a hole is not acknowledged.
    std::unique_lock<std::mutex> lock(mu_);
    resolved_.wait(lock, [&] { return unresolved_.empty() || *unresolved_.begin() > last_ticket; });
  }
  bool synced = true;
  if (any_written && durable_) {
    Status s = device_->sync(since);
    if (!s.ok()) {
      count_failure(s);
      synced = false;
      for (size_t i = 0; i < n; i++)
        if (written[i].region != UINT32_MAX) results[i] = s;
    }
  }

  // Commit: make the written objects visible, unless the caller gave up.
  // Of two copies of a key the one with the higher sequence number stays,
  // whichever commits last; the other is marked deleted on the card.
  // A copy whose sync failed is not acknowledged and never indexed, but it
  // may be on the card: it is voided like an abandoned one (below), and a
  // later delete of its key outranks it (remove()).
  bool all_wanted = true;
  for (size_t i = 0; i < n; i++)
    if (written[i].region != UINT32_MAX) all_wanted &= (wanted[i] = synced && item_wanted(i));
  // written[i] with its key, for a tombstone over that copy: copied here, where one is due, not for every store.
  auto keyed = [&](size_t i) -> const Location& {
    written[i].key.assign(items[i].key);
    return written[i];
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Each item's allocations are made before it changes anything: room in the index for every item (an item that
    // replaces a copy overwrites its slot), in each region's key list, and its tombstone's key and guards.
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += written[i].region != UINT32_MAX;
    index_.reserve(index_.size() + count);
    for (size_t i = 0; i < n; i++) {
      Location& loc = written[i];
      if (loc.region == UINT32_MAX) continue;
      if (loc.offset >= regions_[loc.region].broken_at) {
        // An abandoned store before it could not be marked: recovery's walk
        // ends at that hole. Not acknowledged, never indexed, and voided as
        // a copy not wanted (below): a walk resumed behind damage in front
        // of the hole would find it (docs/card_format.md, Recovery).
        keyed(i);
        void_copy_locked(std::move(loc), &stale);
        settle_locked(tickets[i], false), settled[i] = 1;
        loc.region = UINT32_MAX;
        results[i] = Status::IoError("an earlier store in the region failed and could not be marked");
        continue;
      }
      if (!wanted[i]) {
        keyed(i);
        void_copy_locked(std::move(loc), &stale);
        settle_locked(tickets[i], false), settled[i] = 1;
        continue;
      }
      uint64_t h = loc.hash;
      IndexEntry e{loc.region, static_cast<uint32_t>(loc.offset / kBlockSize), static_cast<uint32_t>(loc.payload_bytes),
                   loc.seq};
      const std::vector<uint32_t> parts = parts_of_locked(loc.region, loc.offset, loc.payload_bytes);
      for (uint32_t r : parts) room_for_one(regions_[r].hashes);
      std::vector<uint32_t> guards;
      std::string old_key;  // the older copy's tombstone names the key (the same index hash: store/index_hash.h)
      const auto flight = inflight_.find(tickets[i]);
      const bool outranked = flight != inflight_.end() && flight->second.outranked;
      if (outranked) {
        keyed(i);  // marked deleted below, as a copy a newer one superseded (no guards: that copy left the index)
      } else if (auto found = index_.find(h); found) {
        const IndexEntry& old = found->second;
        if (old.seq > loc.seq) {
          keyed(i);
          guards = parts_of_locked(old.region, uint64_t(old.block) * kBlockSize, old.payload_bytes);
        } else {
          old_key.assign(items[i].key);
          guards = parts;
        }
      }
      // Nothing below allocates.
      settle_locked(tickets[i], true), settled[i] = 1;
      if (outranked) {  // a newer copy was indexed and left the index while this one was in flight
        counters_.stores++;
        regions_.pin(loc.region);
        stale.push_back({std::move(loc), {}, {}});
        continue;
      }
      auto [it, inserted] = index_.try_emplace(h, e);
      counters_.stores++;
      if (!inserted) {
        const IndexEntry old = it->second;
        if (old.seq > loc.seq) {  // a newer copy committed first: this one is already superseded
          regions_.pin(loc.region);
          for (uint32_t r : guards) regions_.pin(r);
          stale.push_back({std::move(loc), std::move(guards), {}});
          continue;
        }
        regions_.pin(old.region);
        for (uint32_t r : guards) regions_.pin(r);
        stale.push_back({{old.region, uint64_t(old.block) * kBlockSize, regions_[old.region].epoch, old.seq,
                          old.payload_bytes, h, std::move(old_key)},
                         std::move(guards),
                         {}});
        unaccount_locked(old);
        it->second = e;  // the same key's slot: the older copy's entry replaced in place
      }
      uint64_t fp = object_footprint(loc.payload_bytes);
      for_each_part_locked(loc.region, loc.offset, fp, [&](uint32_t r, uint64_t len, uint64_t) {
        regions_[r].live_bytes += len;
        regions_[r].hashes.push_back(h);
      });
      used_bytes_ += fp;
      payload_bytes_ += loc.payload_bytes;
    }
    for (uint32_t r : pinned)
      if (regions_.unpin(r)) unpinned_.notify_all();
    unpinned = true;
    if (stale.empty()) pending_room_ -= held, held = 0;  // no tombstone due: the room goes back here
  }
  stale_handed = true;
  undo.release();
  write_tombstones(ctx, stale, held);
  if (!all_wanted && synced)
    for (size_t i = 0; i < n; i++)
      if (written[i].region != UINT32_MAX && !wanted[i])
        results[i] = Status::TimedOut("store abandoned: deadline passed");
  for (size_t i = 0; i < n; i++) {
    if (results[i].ok() || source_failed[i]) continue;
    counters_.store_failures++;
    if (results[i].io_class() == Status::IoClass::kGatewayMemory) counters_.memory_failures++;  // staging
  }
}

std::vector<uint32_t> CardStore::parts_of_locked(uint32_t region, uint64_t offset, uint64_t payload_bytes) const {
  std::vector<uint32_t> parts;
  for_each_part_locked(region, offset, object_footprint(payload_bytes),
                       [&](uint32_t r, uint64_t, uint64_t) { parts.push_back(r); });
  if (parts.empty()) parts.push_back(region);
  return parts;
}

void CardStore::void_copy_locked(Location loc, std::vector<Stale>* stale) {
  // A copy that was never indexed voids only itself: its tombstone carries
  // seq 0 (no store gets it), so recovery's merge ranks it below every copy.
  // With its own seq it would outrank the older copy still indexed, and
  // that key would be lost on the next restart.
  voiding_.insert(loc.hash);  // first: the only step that allocates (stale has room: put_each)
  regions_.pin(loc.region);
  loc.seq = 0;
  stale->push_back({std::move(loc), {}, {}});
}

void CardStore::pend_stale_locked(std::vector<Stale>& stale) {
  for (Stale& st : stale) {
    if (regions_.unpin(st.loc.region)) unpinned_.notify_all();
    if (st.loc.seq == 0) {
      auto v = voiding_.find(st.loc.hash);
      if (v != voiding_.end()) voiding_.erase(v);
    }
    pending_.push_back(std::move(st));  // room held by the caller: no allocation; its guards stay pinned
  }
  stale.clear();
}

void CardStore::hold_pending_room_locked(size_t k) {
  const size_t need = pending_.size() + pending_room_ + k;
  if (pending_.capacity() < need) pending_.reserve(std::max(need, 2 * pending_.capacity()));
  pending_room_ += k;
}

bool CardStore::write_tombstones(IoContext& ctx, std::vector<Stale>& stale, size_t held) {
  if (stale.empty()) {
    if (held) {
      std::lock_guard<std::mutex> lock(mu_);
      pending_room_ -= held;
    }
    return true;
  }
  bool any = false;
  const uint64_t mark = device_->write_mark();
  try {
    for (Stale& st : stale) {
      st.result = write_tombstone(ctx, st.loc);
      any |= st.result.ok();
    }
    if (any && durable_)
      if (Status s = device_->sync(mark); !s.ok())
        for (Stale& st : stale) st.result = s;
  } catch (const std::bad_alloc&) {
    // Those written are not synced: each goes to pending_ (or is dropped, below), as a failed one does.
    for (Stale& st : stale) st.result = no_memory();
  }
  bool all = true;
  std::lock_guard<std::mutex> lock(mu_);
  // Every failed one goes to pending_, into the room the caller held (no allocation). Until session 27 that room
  // was reserved here, and without it (std::bad_alloc) a failed tombstone was dropped, its guards unpinned: the
  // older copy it was to delete stayed on the card, and once the newer copy's regions were evicted (a delete's
  // tombstone over it with them) the older copy came back at the next open (a void dropped: the never-indexed
  // copy stayed unvoided, outranking a later delete).
  for (Stale& st : stale) {
    if (regions_.unpin(st.loc.region)) unpinned_.notify_all();
    if (st.loc.seq == 0) {  // a void: durable now, or pending
      auto v = voiding_.find(st.loc.hash);
      if (v != voiding_.end()) voiding_.erase(v);
    }
    if (st.result.ok()) {
      for (uint32_t r : st.guards)
        if (regions_.unpin(r)) unpinned_.notify_all();
      continue;
    }
    all = false;
    count_failure(st.result);
    pending_.push_back(std::move(st));
  }
  pending_room_ -= held;
  pending_count_ = pending_.size();
  return all;
}

void CardStore::retry_pending(IoContext& ctx) {
  if (pending_count_.load() == 0) return;
  std::vector<Stale> retry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      retry.reserve(pending_.size());
    } catch (const std::bad_alloc&) {
      return;  // a retry is optional: the next store or delete tries again
    }
    size_t kept = 0;  // those that stay pending (a void whose voiding_ entry could not be made)
    for (Stale& p : pending_) {
      const RegionManager::Region& reg = regions_[p.loc.region];
      if (reg.state != RegionManager::State::kFree && reg.epoch == p.loc.epoch) {
        if (p.loc.seq == 0) {
          try {
            voiding_.insert(p.loc.hash);
          } catch (const std::bad_alloc&) {
            if (&pending_[kept] != &p) pending_[kept] = std::move(p);
            kept++;
            continue;
          }
        }
        regions_.pin(p.loc.region);
        retry.push_back(std::move(p));  // room made above: no allocation
      } else {
        for (uint32_t r : p.guards)  // the older copy's region was reused: nothing left to delete
          if (regions_.unpin(r)) unpinned_.notify_all();
      }
    }
    pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(kept), pending_.end());
    pending_count_ = kept;
    // The slots they leave in pending_ are held for them: one that fails again goes back without allocating.
    pending_room_ += retry.size();
  }
  write_tombstones(ctx, retry, retry.size());
}

Status CardStore::write_in_pieces(IoContext& ctx, const std::vector<Extent>& ext, const PutItem& it, uint64_t epoch,
                                  uint64_t seq, uint32_t flags, bool mapped) {
  // The header carries the CRC, so it goes last (an object whose header is
  // not on the card is torn, as after a cut-off write); the tail block with
  // the last piece.
  const size_t body = it.size & ~(kBlockSize - 1), tail = it.size - body;
  uint8_t* hdr = ctx.header_.data();
  if (mapped) {
    // The payload copied into the mapping and checksummed in one pass, extent
    // by extent (the regions it spans), the rest of its last block zeroed.
    uint8_t* map = device_->mapped();
    uint64_t skip = kBlockSize, done = 0;  // the header block, then the payload
    uint32_t pcrc = 0;
    for (const Extent& x : ext) {
      uint64_t from = std::min(skip, x.len);
      skip -= from;
      uint64_t len = std::min<uint64_t>(x.len - from, it.size - done);
      pcrc = crc32c_copy_extend(pcrc, map + x.at + from, it.data + done, len);
      done += len;
      const bool last = done == it.size;
      if (last && tail) std::memset(map + x.at + from + len, 0, kBlockSize - tail);
      device_->mapped_written(x.at + from, last && tail ? len + kBlockSize - tail : len);
      if (last) break;
    }
    encode_object_header(hdr, card_id_, epoch, seq, it.key, it.size, pcrc, flags);
    return device_->write(ext[0].at, hdr, kBlockSize);
  }
  uint8_t* tb = hdr + kBlockSize;
  if (tail) {
    std::memcpy(tb, it.data + body, tail);
    std::memset(tb + tail, 0, kBlockSize - tail);
  }
  uint32_t pcrc = 0;
  Status s;
  for (size_t done = 0; s.ok() && done < body;) {
    size_t len = std::min(body - done, kPieceBytes);
    pcrc = crc32c_extend(pcrc, it.data + done, len);
    iovec iov[2] = {{const_cast<uint8_t*>(it.data) + done, len}, {tb, kBlockSize}};
    s = io_mapped(true, ext, kBlockSize + done, iov, tail && done + len == body ? 2 : 1);
    done += len;
  }
  if (!s.ok()) return s;
  pcrc = crc32c_extend(pcrc, it.data + body, tail);
  encode_object_header(hdr, card_id_, epoch, seq, it.key, it.size, pcrc, flags);
  return device_->write(ext[0].at, hdr, kBlockSize);
}

Status CardStore::write_filled(IoContext& ctx, const std::vector<Extent>& ext, const PutItem& it, uint64_t epoch,
                               uint64_t seq, uint32_t flags, bool mapped, bool* card_error, bool* source_failed) {
  // Each piece (kFillPieceBytes at most) is filled where it goes, then
  // checksummed there while it is in the CPU's cache: the CRC is of the bytes
  // on the card, whatever the source does meanwhile. The header, which
  // carries the CRC, goes last (or, staged in one I/O, first in it), as in
  // write_in_pieces: an object whose fill failed part way has no header and
  // is abandoned.
  *card_error = false;
  *source_failed = false;
  uint32_t pcrc = 0;
  uint8_t* map = mapped ? device_->mapped() : nullptr;
  auto fill = [&](uint8_t* dst, uint64_t offset, size_t len) {
    for (size_t done = 0; done < len;) {
      size_t l = std::min(len - done, kFillPieceBytes);
      Status s = it.fill(dst + done, offset + done, l);
      if (map) device_->mapped_written(static_cast<uint64_t>(dst + done - map), l);  // what it wrote, even failing
      if (!s.ok()) {
        *source_failed = true;
        return s;
      }
      pcrc = crc32c_extend(pcrc, dst + done, l);
      done += l;
    }
    return Status::Ok();
  };
  uint8_t* hdr = ctx.header_.data();
  const size_t tail = it.size % kBlockSize;
  Status s;
  if (mapped) {
    // Straight into the mapping, extent by extent (the regions it spans),
    // the rest of its last block zeroed.
    uint64_t skip = kBlockSize, done = 0;  // the header block, then the payload
    for (const Extent& x : ext) {
      uint64_t from = std::min(skip, x.len);
      skip -= from;
      uint64_t len = std::min<uint64_t>(x.len - from, it.size - done);
      s = fill(map + x.at + from, done, len);
      if (!s.ok()) return s;
      done += len;
      if (done == it.size && tail) {
        std::memset(map + x.at + from + len, 0, kBlockSize - tail);
        device_->mapped_written(x.at + from + len, kBlockSize - tail);
      }
      if (done == it.size) break;
    }
  } else {
    // Staged: an object of one guarded piece or less in one I/O, header
    // included; a larger one in pieces of kGuardedPieceBytes, then the header.
    const uint64_t fp = object_footprint(it.size);
    const bool whole = fp <= kGuardedPieceBytes;
    if (!ctx.staging_.reserve(whole ? fp : kGuardedPieceBytes))
      return Status::IoError("out of memory for staging", Status::IoClass::kGatewayMemory);
    uint8_t* st = ctx.staging_.data();
    if (whole) {
      s = fill(st + kBlockSize, 0, it.size);
      if (!s.ok()) return s;
      encode_object_header(st, card_id_, epoch, seq, it.key, it.size, pcrc, flags);
      std::memset(st + kBlockSize + it.size, 0, fp - kBlockSize - it.size);
      iovec iov{st, fp};
      s = io_mapped(true, ext, 0, &iov, 1);
      *card_error = !s.ok();
      return s;
    }
    for (uint64_t done = 0; done < it.size;) {
      size_t len = std::min<uint64_t>(it.size - done, kGuardedPieceBytes);
      s = fill(st, done, len);
      if (!s.ok()) return s;
      size_t padded = (len + kBlockSize - 1) & ~(kBlockSize - 1);
      std::memset(st + len, 0, padded - len);
      iovec iov{st, padded};
      s = io_mapped(true, ext, kBlockSize + done, &iov, 1);
      if (!s.ok()) {
        *card_error = true;
        return s;
      }
      done += len;
    }
  }
  encode_object_header(hdr, card_id_, epoch, seq, it.key, it.size, pcrc, flags);
  s = device_->write(ext[0].at, hdr, kBlockSize);
  *card_error = !s.ok();
  return s;
}

Status CardStore::write_body_then_header(IoContext& ctx, const Placement& pl, const PutItem& it, uint64_t epoch,
                                         uint64_t seq, uint32_t flags) {
  // The body (and the tail block) first, while the CrcWorker reads the same
  // memory; then the header with the CRC. A write cut short before the
  // header is a torn object to recovery, as in write_in_pieces.
  ctx.crc_.start(it.data, it.size);
  const size_t body = it.size & ~(kBlockSize - 1), tail = it.size - body;
  uint8_t* hdr = ctx.header_.data();
  uint8_t* tb = hdr + kBlockSize;
  iovec iov[2] = {{const_cast<uint8_t*>(it.data), body}, {tb, kBlockSize}};
  if (tail) {
    std::memcpy(tb, it.data + body, tail);
    std::memset(tb + tail, 0, kBlockSize - tail);
  }
  Status s;
  try {
    s = io_mapped(true, pl.ext, kBlockSize, iov, tail ? 2 : 1);
  } catch (const std::bad_alloc&) {
    ctx.crc_.wait();  // the worker is reading it.data, which the caller may free once put returns
    throw;
  }
  const uint32_t pcrc = ctx.crc_.wait();  // even after a failed write: the worker is reading it.data
  if (!s.ok()) return s;
  encode_object_header(hdr, card_id_, epoch, seq, it.key, it.size, pcrc, flags);
  iovec h{hdr, kBlockSize};
  return io_mapped(true, pl.ext, 0, &h, 1);
}

void CardStore::unpin(uint32_t r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (regions_.unpin(r)) unpinned_.notify_all();
}

Status CardStore::write_tombstone(IoContext& ctx, const Location& loc) {
  if (!ctx.header_.reserve(2 * kBlockSize))
    return Status::IoError("out of memory for staging", Status::IoClass::kGatewayMemory);
  {
    // A direct load of the object reads its header after its payload into
    // the caller's buffer: its get is ordered before this delete (it waits
    // for the read, up to one piece past the load's deadline).
    std::unique_lock<std::mutex> lock(mu_);
    read_done_.wait(lock, [&] {
      return std::find(reading_.begin(), reading_.end(), std::make_pair(loc.hash, loc.seq)) == reading_.end();
    });
  }
  const uint64_t at = region_offset(loc.region) + loc.offset;
  std::string from_header;  // loc's key as its header holds it (loc.key empty: recovery, verify)
  if (loc.key.empty() && loc.seq) {
    ObjectHeader h;
    const uint8_t* b = ctx.header_.data();
    if (Status rs = device_->read(at, ctx.header_.data(), kBlockSize); !rs.ok()) {
      count_failure(rs);
      ADP_WARN("object at region %u offset %" PRIu64 " of card %s: its header unreadable (%s): tombstone keyless",
               loc.region, loc.offset, path().c_str(), rs.message().c_str());
    } else if (decode_object_header(b, card_id_, loc.epoch, &h) && !(h.flags & kObjectPad) && h.seq == loc.seq &&
               index_hash(object_key(b, h)) == loc.hash) {
      from_header = object_key(b, h);  // the object's, or (a retry) its tombstone's already written: kept
    }
  }
  encode_tombstone(ctx.header_.data(), card_id_, loc.epoch, loc.seq, loc.key.empty() ? from_header : loc.key,
                   loc.payload_bytes, continues(loc.offset, loc.payload_bytes));
  return device_->write(at, ctx.header_.data(), kBlockSize);
}

std::string CardStore::check_entry_header(const uint8_t* block, uint64_t hash, const IndexEntry& e, uint64_t epoch,
                                          std::string_view key, Status* io) const {
  ObjectHeader hdr;
  if (!decode_object_header(block, card_id_, epoch, &hdr)) return "header damaged";
  if ((hdr.flags & kObjectDeleted) && hdr.seq == e.seq) {  // our own tombstone: deleted or superseded while we read
    *io = Status::NotFound("deleted meanwhile");
    return std::string();
  }
  if ((hdr.flags & kObjectDeleted) || hdr.seq != e.seq || hdr.payload_bytes != e.payload_bytes)
    return "header does not match the index";
  if (index_hash(std::string_view(reinterpret_cast<const char*>(block) + sizeof hdr, hdr.key_bytes)) != hash)
    return "key does not match the index";
  // The whole key, not only its index hash (keys share one by chance only,
  // 2^-64 a pair: store/index_hash.h): another key's object is a miss
  // before any of its bytes reaches the caller's buffer (or bounce buffer).
  if (!key.empty() && std::string_view(reinterpret_cast<const char*>(block) + sizeof hdr, hdr.key_bytes) != key)
    *io = Status::NotFound("another key with the same hash");
  return std::string();
}

std::string CardStore::read_and_check(IoContext& ctx, uint64_t hash, const IndexEntry& e, Status* io,
                                      bool check_payload, uint8_t* payload_dst, const PieceGuardFn* guard,
                                      std::string_view key, size_t guard_piece_bytes) {
  uint64_t epoch;
  uint64_t fp = object_footprint(e.payload_bytes);
  std::vector<Extent> ext;
  std::vector<uint32_t> regs;
  // Mapped (a memory-backed card): the header block is copied into staging,
  // the payload from the mapping straight into payload_dst (any alignment),
  // its CRC computed in the same pass: one read and one write of each byte,
  // as a memcpy (piece by piece over the regions it spans). Otherwise
  // direct: the header block, and a partial last block, into staging; the
  // payload's whole blocks straight into payload_dst, in pieces small enough
  // that each is checked while it is still in the CPU's cache; with a guard
  // each piece is read under it (the header block with the first).
  const uint8_t* map = payload_dst ? device_->mapped() : nullptr;
  bool mapped = false, direct = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Checked under the same lock as the pins: once unlocked after a lookup,
    // the entry's regions may have been evicted and reused under a new epoch.
    auto it = index_.find(hash);
    if (it == index_.end() || it->second.seq != e.seq ||
        !extents_locked(e.region, uint64_t(e.block) * kBlockSize, fp, &ext, &regs)) {
      *io = Status::NotFound("evicted, replaced or deleted meanwhile");
      return std::string();
    }
    mapped = map && ext.back().at + ext.back().len <= device_->size();
    direct = !mapped && payload_dst && reinterpret_cast<uintptr_t>(payload_dst) % kBlockSize == 0;
    // A direct load writes payload_dst before it sees the header: it is
    // registered in reading_ (a tombstone of the object waits for it), and
    // one whose tombstone is being written already (a delete) is a miss now.
    if (direct &&
        std::find(removing_.begin(), removing_.end(), std::make_pair(hash, uint64_t(e.seq))) != removing_.end()) {
      *io = Status::NotFound("being deleted");
      return std::string();
    }
    if (direct) reading_.emplace_back(hash, e.seq);
    for (uint32_t r : regs) regions_.pin(r);  // every region the object has bytes in
    regions_.touch(e.region);
    epoch = regions_[e.region].epoch;
  }
  // Its pins and its reading_ entry go on every way out (an exception too: a tombstone of the object waits for
  // the entry, an eviction of its regions for the pins; session 26). Allocates nothing.
  bool released = false;
  auto release = [&] {
    if (released) return;
    released = true;
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t r : regs)
      if (regions_.unpin(r)) unpinned_.notify_all();
    if (direct) {
      auto mine = std::find(reading_.begin(), reading_.end(), std::make_pair(hash, uint64_t(e.seq)));
      *mine = reading_.back();
      reading_.pop_back();
      read_done_.notify_all();
    }
  };
  ScopeExit release_on_exit(release);
  const size_t body = e.payload_bytes & ~(kBlockSize - 1), tail = e.payload_bytes - body;
  uint32_t body_crc = 0;
  // Checks the header block in staging against e: empty if it is e's object
  // (or, with *io set to NotFound, if it was deleted while we read, or it is
  // another key with the same index hash), else the reason it is damaged.
  auto check_header = [&]() -> std::string { return check_entry_header(ctx.staging_.data(), hash, e, epoch, key, io); };
  std::string header_why;  // check_header()'s answer, when it was read and checked before the payload
  bool header_checked = false;
  // Staging: the header block and a tail block, or (not direct) the object.
  const size_t staging = mapped || direct ? 2 * kBlockSize : fp;
  if (!ctx.staging_.reserve(staging)) {
    *io = Status::IoError("out of memory for staging", Status::IoClass::kGatewayMemory);
  } else if (mapped) {
    std::memcpy(ctx.staging_.data(), map + ext[0].at, kBlockSize);
    *io = Status::Ok();
    // The header (and key) is checked first: a miss found there leaves
    // payload_dst untouched. With a guard the payload is copied in pieces,
    // each under it.
    header_why = check_header(), header_checked = true;
    uint64_t skip = kBlockSize, done = 0;  // the header block, then the payload's bytes
    for (size_t k = 0; k < ext.size() && io->ok() && header_why.empty(); k++) {
      const Extent& x = ext[k];
      uint64_t from = std::min(skip, x.len);
      skip -= from;
      const uint64_t end = from + std::min(x.len - from, e.payload_bytes - done);
      while (from < end) {
        const uint64_t len = guard ? std::min<uint64_t>(end - from, kPieceBytes) : end - from;
        auto copy = [&] {
          if (check_payload)
            body_crc = crc32c_copy_extend(body_crc, payload_dst + done, map + x.at + from, len);
          else
            std::memcpy(payload_dst + done, map + x.at + from, len);
        };
        if (!guard) {
          copy();
        } else if (!(*guard)(done + len, copy)) {
          *io = Status::TimedOut("deadline passed while the object was read into the buffer");
          break;
        }
        from += len;
        done += len;
      }
    }
  } else if (direct) {
    const size_t piece = !guard               ? kPieceBytes
                         : !guard_piece_bytes ? kGuardedPieceBytes
                                              : std::max<size_t>(guard_piece_bytes & ~(kBlockSize - 1), kBlockSize);
    // The header block (into staging) rides with the payload's first piece
    // (straight into payload_dst) and, when that is all, the tail block:
    // an object of up to a piece in one request. The header is checked after
    // the read; what would make it a miss was ruled out before it: another
    // key by the keyed index hash (lookup()), a delete or replacement by
    // `reading_` (a registered load is waited for by the tombstone of what
    // it reads, write_tombstone()). What is left writes payload_dst and is
    // then a miss: damage (dropped), or two keys of one index hash (2^-64 a
    // pair, not craftable without the process's secret: index_hash.h).
    // With a guard, the CRC of each piece but the last runs on ctx's
    // CrcWorker while the next piece is read; the last one's (up to a piece)
    // after it, here: on this VM's disk each request waited 15-20 ms in the
    // card's queue (an MP server's prefetch, 4 workers) against 1-3 ms for a
    // 32 MiB CRC (benchmarks/results/2026-12-04-0625-diskload.md).
    const bool overlap = guard && check_payload;
    size_t crc_pending = 0;  // bytes whose CRC runs on ctx.crc_
    auto join_crc = [&] {
      if (crc_pending) body_crc = crc32c_combine(body_crc, ctx.crc_.wait(), crc_pending);
      crc_pending = 0;
    };
    ScopeExit join_on_exit([&] { join_crc(); });  // an exception too: the CrcWorker may be reading payload_dst
    size_t done = 0;
    do {
      size_t len = std::min(body - done, piece);
      iovec iov[3];
      int n = 0;
      if (done == 0) iov[n++] = {ctx.staging_.data(), kBlockSize};
      if (len) iov[n++] = {payload_dst + done, len};
      if (tail && done + len == body) iov[n++] = {ctx.staging_.data() + kBlockSize, kBlockSize};
      const uint64_t at = done == 0 ? 0 : kBlockSize + done;
      auto read_piece = [&] { *io = io_mapped(false, ext, at, iov, n); };
      if (!guard) {
        read_piece();
      } else if (!(*guard)(done + len, read_piece)) {
        *io = Status::TimedOut("deadline passed while the object was read into the buffer");
        break;
      }
      if (check_payload && io->ok()) {
        if (!overlap) {
          body_crc = crc32c_extend(body_crc, payload_dst + done, len);
        } else if (done + len < body) {
          join_crc();
          ctx.crc_.start(payload_dst + done, len);
          crc_pending = len;
        } else {
          const uint32_t last = crc32c(payload_dst + done, len);
          join_crc();
          body_crc = crc32c_combine(body_crc, last, len);
        }
      }
      done += len;
    } while (io->ok() && done < body);
    join_crc();  // also after a failed or declined piece: the CrcWorker may still read payload_dst
    join_on_exit.release();
  } else {
    iovec whole{ctx.staging_.data(), fp};
    *io = io_mapped(false, ext, 0, &whole, 1);
  }
  release();
  // Deleted meanwhile, or the caller gave up part way (a failure, not a
  // miss: the buffer may hold the pieces read): no damage either way.
  if (io->is_not_found() || io->code() == Status::Code::kTimedOut) return std::string();
  if (!io->ok()) {
    count_failure(*io);  // the card's, or (no staging) this process's memory
    return io->message();
  }
  counters_.bytes_read += fp;
  const uint8_t* block = ctx.staging_.data();
  std::string why = header_checked ? header_why : check_header();
  if (!why.empty() && overwritten_meanwhile(hash, e)) {
    *io = Status::NotFound("deleted or replaced while it was read");
    return std::string();
  }
  if (!why.empty() || !io->ok()) return why;
  ObjectHeader hdr;
  std::memcpy(&hdr, block, sizeof hdr);
  if (direct && tail) {
    auto copy_tail = [&] { std::memcpy(payload_dst + body, block + kBlockSize, tail); };
    if (!guard) {
      copy_tail();
    } else if (!(*guard)(e.payload_bytes, copy_tail)) {
      *io = Status::TimedOut("deadline passed while the object was read into the buffer");
      return std::string();
    }
  }
  if (check_payload && (mapped   ? body_crc
                        : direct ? crc32c_extend(body_crc, payload_dst + body, tail)
                                 : crc32c(block + kBlockSize, hdr.payload_bytes)) != hdr.payload_crc)
    return "payload checksum mismatch";
  return std::string();
}

Status CardStore::lookup(std::string_view key, uint64_t* hash, IndexEntry* e) {
  Status ks = check_key(key);
  if (!ks.ok()) return ks;
  *hash = index_hash(key);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(*hash);
  if (it == index_.end()) {
    counters_.misses++;
    return Status::NotFound();
  }
  *e = it->second;
  return Status::Ok();
}

Status CardStore::get_via_bounce(std::string_view key, const std::function<bool(size_t size)>& accept,
                                 const WithContextFn& with_ctx, std::span<AlignedBuffer> bounces, AlignedBuffer* hold,
                                 const SinkFn& sink, const RunPiecesFn& run_pieces, size_t piece_bytes) {
  const StoreCall call;
  // Ends after this store was closed and freed where the run or the sink
  // said stop (a gateway's thread left behind): it holds only the count.
  const Foreground busy = device_->begin_foreground();
  namespace prof = load_profile;
  if (!piece_bytes) piece_bytes = kBouncePieceBytes;
  const uint64_t look_from = prof::kEnabled ? prof::now_ns() : 0;
  uint64_t h;
  IndexEntry e;
  Status ls;
  {
    prof::Timer t(prof::kIndex);
    ls = lookup(key, &h, &e);
  }
  if (!ls.ok()) return ls;
  if (!accept(e.payload_bytes)) {
    counters_.misses++;
    return Status::NotFound("not delivered");
  }
  const uint64_t fp = object_footprint(e.payload_bytes);
  const uint8_t* map = device_->mapped();
  const size_t pieces = (e.payload_bytes + piece_bytes - 1) / piece_bytes;
  auto piece_len = [&](size_t i) { return std::min<uint64_t>(e.payload_bytes - i * piece_bytes, piece_bytes); };
  // Pieces in order on this thread, or on several (run_pieces).
  auto run = [&](const std::function<bool(size_t, int)>& piece) {
    if (run_pieces) return run_pieces(pieces, piece);
    for (size_t i = 0; i < pieces; i++)
      if (!piece(i, 0)) return false;
    return true;
  };
  Status io;
  std::string bad;  // why the object is damaged (it is then dropped)
  auto drop = [&] {
    counters_.misses++;
    ADP_WARN("object at region %u offset %" PRIu64 " of card %s: %s; dropped, served as a miss", e.region,
             uint64_t(e.block) * kBlockSize, path().c_str(), bad.c_str());
    // Under a context of its own (the tombstone's write); none free: the
    // next load of the object finds it damaged again.
    with_ctx([&](IoContext& ctx) {
      ctx.store_ = this;
      drop_damaged(ctx, h, e, key);
    });
    return Status::NotFound();
  };
  if (bounces.empty() || !bounces[0].reserve(piece_bytes)) {
    counters_.memory_failures++;
    return Status::IoError("out of memory for a bounce buffer", Status::IoClass::kGatewayMemory);
  }
  // A memory-speed card: each piece copied from the mapping into a bounce
  // buffer under pins taken only for that copy, after checking that e is
  // still the entry of h with its regions of the epochs first seen. The
  // first look (this thread, before any piece) takes the extents and epochs;
  // the pieces, on any thread, only compare and pin.
  std::vector<Extent> ext;
  std::vector<uint32_t> regs;
  std::vector<uint64_t> epochs;
  uint64_t epoch = 0;  // e.region's
  auto pin = [&]() -> bool {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(h);
    if (it == index_.end() || it->second.seq != e.seq) return false;
    for (size_t i = 0; i < regs.size(); i++)
      if (regions_[regs[i]].epoch != epochs[i]) return false;
    for (uint32_t r : regs) regions_.pin(r);
    return true;
  };
  auto unpin_all = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t r : regs)
      if (regions_.unpin(r)) unpinned_.notify_all();
  };
  bool mapped = false;
  uint64_t header_from = 0;  // kHeader: from the header's copy to the end of its check, one step
  if (map) {
    {
      prof::Timer t(prof::kFirstLook);
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(h);
      if (it == index_.end() || it->second.seq != e.seq ||
          !extents_locked(e.region, uint64_t(e.block) * kBlockSize, fp, &ext, &regs)) {
        counters_.misses++;
        return Status::NotFound("evicted, replaced or deleted meanwhile");
      }
      for (uint32_t r : regs) epochs.push_back(regions_[r].epoch);
      epoch = regions_[e.region].epoch;
      regions_.touch(e.region);
      for (uint32_t r : regs) regions_.pin(r);
    }
    mapped = ext.back().at + ext.back().len <= device_->size();
    header_from = prof::kEnabled ? prof::now_ns() : 0;
    if (mapped) std::memcpy(bounces[0].data(), map + ext[0].at, kBlockSize);
    unpin_all();
  }
  if (mapped) {
    ObjectHeader hdr;
    std::memcpy(&hdr, bounces[0].data(), sizeof hdr);
    bad = check_entry_header(bounces[0].data(), h, e, epoch, key, &io);
    if (header_from) prof::add(prof::kHeader, prof::now_ns() - header_from);
    if (!bad.empty() && overwritten_meanwhile(h, e)) io = Status::NotFound("deleted or replaced while it was read");
    if (!io.ok()) {
      if (io.is_not_found()) counters_.misses++;
      return io;
    }
    if (!bad.empty()) return drop();
    // Copies the payload's bytes [off, off + len) from the extents into dst; their CRC.
    auto copy_piece = [&](uint64_t off, uint64_t len, uint8_t* dst) {
      uint32_t crc = 0;
      uint64_t at = kBlockSize + off;  // past the header block
      for (const Extent& x : ext) {
        if (at >= x.len) {
          at -= x.len;
          continue;
        }
        const uint64_t take = std::min(len, x.len - at);
        crc = crc32c_copy_extend(crc, dst, map + x.at + at, take);
        dst += take;
        len -= take;
        at = 0;
        if (!len) break;
      }
      return crc;
    };
    // Each piece's CRC, joined in order after the last (pieces run in any order).
    std::vector<uint32_t> crcs(pieces);
    if (prof::kEnabled) prof::add(prof::kLookup, prof::now_ns() - look_from);
    std::atomic<bool> changed{false}, stopped{false}, no_memory{false};
    const uint64_t run_from = prof::kEnabled ? prof::now_ns() : 0;
    const bool ran = run([&](size_t i, int slot) {
      AlignedBuffer& b = bounces[slot];
      const uint64_t off = i * piece_bytes, len = piece_len(i);
      if (!b.reserve(piece_bytes)) {  // counted here, inside the run (the store may be gone after it)
        if (!no_memory.exchange(true)) counters_.memory_failures++;
        return false;
      }
      bool pinned;
      {
        prof::Timer t(prof::kPin);
        pinned = pin();
      }
      if (!pinned) {                                      // the pieces sent so far were this object's
        if (!changed.exchange(true)) counters_.misses++;  // here: after run, the store may be out of bounds
        return false;
      }
      {
        prof::Timer t(prof::kCopy);
        crcs[i] = copy_piece(off, len, b.data());
      }
      {
        prof::Timer t(prof::kUnpin);
        unpin_all();
      }
      if (!sink(off, b.data(), len)) {
        stopped = true;
        return false;
      }
      return true;
    });
    if (prof::kEnabled) prof::add(prof::kRun, prof::now_ns() - run_from);
    // The sink's refusal first, or run_pieces' false with no piece failing
    // (it ran none, or no longer may): either may mean the caller must not
    // touch the store again (a gateway that closed its card without it), so
    // no failure here does.
    if (stopped || (!ran && !changed && !no_memory))
      return Status::TimedOut("the load was stopped while its pieces went out");
    if (changed) return Status::NotFound("evicted, replaced or deleted while its pieces went out");
    if (no_memory) return Status::IoError("out of memory for a bounce buffer", Status::IoClass::kGatewayMemory);
    uint32_t crc = 0;
    {
      prof::Timer t(prof::kCombine);
      for (size_t i = 0; i < pieces; i++) crc = crc32c_combine(crc, crcs[i], piece_len(i));
    }
    if (crc != hdr.payload_crc) {
      bad = "payload checksum mismatch";
      return drop();
    }
    counters_.bytes_read += fp;
    counters_.hits++;
    return Status::Ok();
  }
  // Any other card: read and checked whole in a context's staging, which
  // then trades places with `hold`, so the context goes back before the
  // first piece goes out.
  const bool got = with_ctx([&](IoContext& ctx) {
    ctx.store_ = this;
    bad = read_and_check(ctx, h, e, &io, true, nullptr, nullptr, key);
    if (io.ok() && bad.empty()) ctx.staging_.swap(*hold);
  });
  if (!got) return Status::TimedOut("no I/O context came free before the deadline");
  if (!io.ok()) {
    if (io.is_not_found()) counters_.misses++;
    return io;
  }
  if (!bad.empty()) return drop();
  const uint8_t* payload = hold->data() + kBlockSize;
  if (!run([&](size_t i, int) { return sink(i * piece_bytes, payload + i * piece_bytes, piece_len(i)); }))
    return Status::TimedOut("the load was stopped while its pieces went out");
  counters_.hits++;
  return Status::Ok();
}

bool CardStore::overwritten_meanwhile(uint64_t hash, const IndexEntry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(hash);
  if (it == index_.end() || it->second.seq != e.seq) return true;
  return std::find(removing_.begin(), removing_.end(), std::make_pair(hash, uint64_t(e.seq))) != removing_.end();
}

void CardStore::drop_damaged(IoContext& ctx, uint64_t hash, const IndexEntry& e, std::string_view key) {
  counters_.checksum_failures++;
  Location loc{e.region, uint64_t(e.block) * kBlockSize, 0, e.seq, e.payload_bytes, hash, std::string(key)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(hash);
    if (it == index_.end() || it->second.seq != e.seq) return;  // already replaced or gone
    erase_entry_locked(hash, it->second);
    regions_.pin(e.region);
    loc.epoch = regions_[e.region].epoch;
  }
  const ScopeExit unpin_on_exit([&] { unpin(e.region); });  // an exception too (session 26)
  // A read-only card (CardOptions::read_only) drops it from the index only: its tombstone is no I/O error.
  Status ts = read_only_ ? Status::Ok() : write_tombstone(ctx, loc);
  if (!ts.ok()) count_failure(ts);
}

Status CardStore::get(IoContext& ctx, std::string_view key, const DeliverPayloadFn& deliver, ReadInto into,
                      const PieceGuardFn& pieces, size_t piece_bytes) {
  const StoreCall call;
  const Foreground busy = device_->begin_foreground();
  ctx.store_ = this;
  uint64_t h;
  IndexEntry e;
  Status ls = lookup(key, &h, &e);
  if (!ls.ok()) return ls;
  Status io;
  std::string bad;     // why the object is damaged (it is then dropped)
  bool other = false;  // another key with the same index hash
  // Reads the object (the payload into dst when given), checks header and
  // key (and the payload CRC if asked); true if it is key's intact object.
  auto read = [&](uint8_t* dst, bool check_payload, const PieceGuardFn* guard = nullptr) {
    bad = read_and_check(ctx, h, e, &io, check_payload, dst, guard, key, piece_bytes);
    if (!io.ok() || !bad.empty()) return false;
    ObjectHeader hdr;
    std::memcpy(&hdr, ctx.staging_.data(), sizeof hdr);
    other = std::string_view(reinterpret_cast<const char*>(ctx.staging_.data()) + sizeof hdr, hdr.key_bytes) != key;
    return !other;
  };
  // Copies a payload read into staging to dst, checking its CRC on the way.
  auto copy_staged = [&](uint8_t* dst) {
    ObjectHeader hdr;
    std::memcpy(&hdr, ctx.staging_.data(), sizeof hdr);
    if (crc32c_copy(dst, ctx.staging_.data() + kBlockSize, e.payload_bytes) == hdr.payload_crc) return true;
    bad = "payload checksum mismatch";
    return false;
  };
  bool delivered;
  if (into == ReadInto::kStaging) {
    delivered = read(nullptr, false) && deliver(e.payload_bytes, copy_staged);
  } else if (into == ReadInto::kPieces) {
    uint8_t* dst = nullptr;
    delivered = deliver(e.payload_bytes, [&](uint8_t* d) {
      dst = d;
      return true;
    });
    // Read straight into dst only an object of more than one piece from
    // 4 KiB aligned memory, from a disk card: its header is checked after the
    // read (read_and_check), and a gateway's ring loads in pieces (r4: each
    // piece published to the client as it lands) from memory-speed cards
    // only, so no piece reaches a client before its header is checked (a
    // memory-backed card whose mapping failed is staged). One of a piece or
    // less is staged: header and
    // payload in one read into this worker's staging, then one copy under
    // the guard (bounded like a piece's read). Straight into dst it took two
    // reads (the header block is checked before any byte reaches dst), and on
    // this VM's disk a read into LMCache's L1 ran 0.67-0.83x of one into a
    // reused staging buffer, so staging loaded faster at 256 KiB-4 MiB with
    // 4 workers (benchmarks/README.md, "Disk loads of one piece, staged").
    // Why: a read costs per physically contiguous run of its destination (a
    // segment each; over the queue's max_segments it is split), and L1's 4 KiB
    // pages are scattered; the staging is in huge pages (IoContext). Straight
    // into L1 at 2 MiB read 0.67-0.95x of staged in the same passes
    // (benchmarks/results/2026-12-04-1240-diskload.md).
    // A memory-speed card is copied from its mapping in pieces at any size
    // and alignment (a gateway publishes each piece to its client).
    const bool aligned = reinterpret_cast<uintptr_t>(dst) % kBlockSize == 0;
    if (delivered &&
        (device_->mapped() || (aligned && e.payload_bytes > kGuardedPieceBytes && !device_->memory_backed()))) {
      delivered = read(dst, true, &pieces);
    } else if (delivered) {  // one piece or less, or unaligned: staged, then copied in one piece
      bool copied = false;
      delivered = read(nullptr, false) && pieces(e.payload_bytes, [&] { copied = copy_staged(dst); }) && copied;
    }
  } else {
    delivered = deliver(e.payload_bytes, [&](uint8_t* dst) {
      bool direct = device_->mapped() || reinterpret_cast<uintptr_t>(dst) % kBlockSize == 0;
      return read(direct ? dst : nullptr, direct) && (direct || copy_staged(dst));
    });
  }
  if (!io.ok()) {
    if (io.is_not_found()) counters_.misses++;
    return io;
  }
  if (!bad.empty()) {
    counters_.misses++;
    ADP_WARN("object at region %u offset %" PRIu64 " of card %s: %s; dropped, served as a miss", e.region,
             uint64_t(e.block) * kBlockSize, path().c_str(), bad.c_str());
    drop_damaged(ctx, h, e, key);
    return Status::NotFound();
  }
  if (other) {
    counters_.misses++;
    return Status::NotFound();
  }
  if (!delivered) {
    counters_.misses++;
    return Status::NotFound("not delivered");
  }
  counters_.hits++;
  return Status::Ok();
}

bool CardStore::exists(std::string_view key) {
  const StoreCall call;
  if (!check_key(key).ok()) return false;
  uint64_t h = index_hash(key);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(h);
  if (it == index_.end()) return false;
  regions_.touch(it->second.region);
  return true;
}

bool CardStore::unsettled_locked(uint64_t hash) const {
  if (voiding_.count(hash)) return true;
  for (const auto& [ticket, s] : inflight_)
    if (s.hash == hash) return true;
  return false;
}

Status CardStore::remove_refusal_locked(uint64_t hash) const {
  // A copy of the key that may be on the card and is neither indexed nor
  // durably voided would outrank this delete at recovery: the delete
  // waits for it (the caller retries; LMCache keeps the key to evict again).
  for (const Stale& p : pending_)
    if (p.loc.hash == hash && p.loc.seq == 0)
      return Status::IoError("a failed store of this key is not yet marked deleted on card " + path() +
                             "; the delete is not done");
  if (unsettled_locked(hash))
    return Status::Busy("a store of this key is in flight on card " + path() + "; the delete is not done");
  return Status::Ok();
}

Status CardStore::check_remove_header(IoContext& ctx, std::string_view key, uint64_t hash, const IndexEntry& e,
                                      uint64_t epoch, bool* changed) {
  *changed = false;
  if (!ctx.header_.reserve(2 * kBlockSize))
    return Status::IoError("out of memory for staging", Status::IoClass::kGatewayMemory);
  Status io = device_->read(region_offset(e.region) + uint64_t(e.block) * kBlockSize, ctx.header_.data(), kBlockSize);
  if (!io.ok()) {
    count_failure(io);
    return io;
  }
  counters_.bytes_read += kBlockSize;
  const uint8_t* block = ctx.header_.data();
  const std::string why = check_entry_header(block, hash, e, epoch, key, &io);
  if (why.empty()) {
    // NotFound: another key's object, or its own tombstone (deleted or
    // replaced since the lookup).
    ObjectHeader hdr;
    std::memcpy(&hdr, block, sizeof hdr);
    *changed = io.is_not_found() && (hdr.flags & kObjectDeleted);
    return io;
  }
  if (overwritten_meanwhile(hash, e)) {  // a tombstone half written over it
    *changed = true;
    return Status::NotFound("deleted or replaced while its header was read");
  }
  ADP_WARN("object at region %u offset %" PRIu64 " of card %s: %s; dropped at its delete", e.region,
           uint64_t(e.block) * kBlockSize, path().c_str(), why.c_str());
  drop_damaged(ctx, hash, e, key);  // as a load would (counted); found by key's index hash: key's
  return Status::NotFound("damaged: " + why);
}

Status CardStore::remove(IoContext& ctx, std::string_view key) {
  const StoreCall call;
  const Foreground busy = device_->begin_foreground();
  ctx.store_ = this;
  Status s = check_key(key);
  if (!s.ok()) return s;
  if (read_only_) return read_only_refusal("delete");
  retry_pending(ctx);
  const uint64_t h = index_hash(key);
  Location loc;
  loc.key.assign(key);  // made before anything changes (session 26)
  IndexEntry e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = remove_refusal_locked(h);
    if (!s.ok()) return s;
    auto it = index_.find(h);
    if (it == index_.end()) return Status::NotFound();
    e = it->second;
    regions_.pin(e.region);
    loc.region = e.region;
    loc.offset = uint64_t(e.block) * kBlockSize;
    loc.epoch = regions_[e.region].epoch;
    loc.seq = e.seq;
    loc.payload_bytes = e.payload_bytes;
    loc.hash = h;
  }
  // An exception (std::bad_alloc) out of the delete from here on leaves the key as it was (session 26): its region
  // unpinned, its removing_ entry (once made) erased, the tombstone maybe written: the key reads as before until
  // the next open, which finds the tombstone (the delete done) or not. Allocates nothing.
  bool in_removing = false;
  ScopeExit undo([&] {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_removing) {
      auto mine = std::find(removing_.begin(), removing_.end(), std::make_pair(h, loc.seq));
      *mine = removing_.back();
      removing_.pop_back();
    }
    if (regions_.unpin(loc.region)) unpinned_.notify_all();
  });
  // The whole key is compared with the object's header (its region pinned
  // meanwhile) before anything is written. Not yet in
  // removing_: a load of the object is not turned away by a delete that
  // may turn out to be another key's.
  bool changed = false;  // the header read found e's object deleted or replaced already
  s = check_remove_header(ctx, key, h, e, loc.epoch, &changed);
  if (s.ok() || changed) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(h);
    if (s.ok()) s = remove_refusal_locked(h);
    // Replaced meanwhile: the newer copy (which may be another key's) stays;
    // the store that replaced it marks this copy deleted. Deleted or
    // evicted meanwhile (or its tombstone being written by another delete):
    // NotFound, as before.
    if (it != index_.end() && it->second.seq != e.seq)
      s = Status::Busy("a newer copy was stored while the key was deleted");
    else if (it == index_.end() || changed)
      s = Status::NotFound();
    if (s.ok()) {  // until the entry is erased, or the write failed
      removing_.emplace_back(h, loc.seq);
      in_removing = true;
    }
  }
  if (!s.ok()) return s;  // undo: unpinned
  // The tombstone goes to the card first (and is synced when durable): a
  // delete that is not on the card is not reported as done (it would come
  // back after a restart).
  const uint64_t mark = device_->write_mark();
  s = write_tombstone(ctx, loc);
  if (s.ok() && durable_) s = device_->sync(mark);
  bool erased = false, superseded = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(h);
    if (s.ok() && it != index_.end()) {
      superseded = it->second.seq != loc.seq;
      if (!superseded) erase_entry_locked(h, it->second);
      erased = !superseded;
    }
    auto mine = std::find(removing_.begin(), removing_.end(), std::make_pair(h, loc.seq));
    *mine = removing_.back();
    removing_.pop_back();
    if (regions_.unpin(loc.region)) unpinned_.notify_all();
    undo.release();
  }
  if (!s.ok()) {
    count_failure(s);
    return s;
  }
  if (erased) counters_.deletes++;
  if (superseded) return Status::Busy("a newer copy was stored while the key was deleted");
  return erased ? Status::Ok() : Status::NotFound();  // evicted meanwhile
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
