// SPDX-License-Identifier: Apache-2.0
#include "store/card_store.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <random>
#include <thread>
#include <tuple>

#include "util/crc32c.h"
#include "util/log.h"

namespace adp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Many regions make eviction fine-grained and leave room for every writer's
// open region; large ones take large objects (the largest object is one
// region; 256 tokens of Llama-8B KV are 32 MiB). So: at least 32 regions,
// but not below 64 MiB while that still leaves kMinRegions (cards from
// 513 MiB take 32 MiB chunks).
uint64_t default_region_bytes(uint64_t data_bytes) {
  constexpr uint64_t kLargeChunkRegion = 64u << 20;
  uint64_t r = kMaxRegionBytes;
  while (r > kMinRegionBytes && data_bytes / r < 32 && !(r == kLargeChunkRegion && data_bytes / r >= kMinRegions))
    r /= 2;
  while (r > kMinRegionBytes && data_bytes / r < kMinRegions) r /= 2;
  return r;
}

uint32_t superblock_crc(const Superblock& sb) { return crc32c(&sb, offsetof(Superblock, crc)); }
uint32_t region_crc(const RegionHeader& h) { return crc32c(&h, offsetof(RegionHeader, crc)); }
uint32_t header_crc(const ObjectHeader& h, const void* key) {
  return crc32c_extend(crc32c(&h, offsetof(ObjectHeader, header_crc)), key, h.key_bytes);
}

bool valid_superblock(const Superblock& sb) {
  return std::memcmp(sb.magic, kSuperMagic, 8) == 0 && sb.crc == superblock_crc(sb);
}

bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::all_of(b, b + n, [](uint8_t c) { return c == 0; });
}

// Fills `block` (kBlockSize bytes) with an object header and its key.
void encode_header(uint8_t* block, uint64_t card_id, uint64_t epoch, uint64_t seq, std::string_view key,
                   uint64_t payload_bytes, uint32_t payload_crc, uint32_t flags) {
  std::memset(block, 0, kBlockSize);
  ObjectHeader h{};
  std::memcpy(h.magic, kObjectMagic, 8);
  h.card_id = card_id;
  h.epoch = epoch;
  h.seq = seq;
  h.key_hash = hash_key(key);
  h.payload_bytes = payload_bytes;
  h.flags = flags;
  h.key_bytes = static_cast<uint32_t>(key.size());
  h.payload_crc = payload_crc;
  if (!key.empty()) std::memcpy(block + sizeof h, key.data(), key.size());  // tombstones pass a null key
  h.header_crc = header_crc(h, block + sizeof h);
  std::memcpy(block, &h, sizeof h);
}

// Checks the header block of an object written under (card_id, epoch).
bool decode_header(const uint8_t* block, uint64_t card_id, uint64_t epoch, ObjectHeader* out) {
  std::memcpy(out, block, sizeof *out);
  return std::memcmp(out->magic, kObjectMagic, 8) == 0 && out->card_id == card_id && out->epoch == epoch &&
         out->key_bytes <= kMaxKeyBytes && out->header_crc == header_crc(*out, block + sizeof *out);
}

}  // namespace

IoContext::~IoContext() {
  if (store_) store_->release_region(*this);
}

Status CardStore::check_key(std::string_view key) {
  if (key.empty()) return Status::InvalidArgument("empty key");
  if (key.size() > kMaxKeyBytes)
    return Status::InvalidArgument("key of " + std::to_string(key.size()) + " bytes exceeds the bound of " +
                                   std::to_string(kMaxKeyBytes) + " bytes");
  return Status::Ok();
}

Status CardStore::Format(const std::string& path, uint64_t create_bytes, uint64_t region_bytes) {
  std::unique_ptr<CardDevice> dev;
  Status s = CardDevice::Open(path, create_bytes, &dev);
  if (!s.ok()) return s;
  uint64_t size = dev->size() & ~(kBlockSize - 1);
  if (size < kDataOffset + kMinRegions * kMinRegionBytes)
    return Status::InvalidArgument("card " + path + " has " + std::to_string(size) + " bytes; at least " +
                                   std::to_string(kDataOffset + kMinRegions * kMinRegionBytes) + " are needed");
  uint64_t data_bytes = size - kDataOffset;
  if (region_bytes == 0) region_bytes = default_region_bytes(data_bytes);
  if (region_bytes % kBlockSize || region_bytes < kMinRegionBytes || region_bytes > kMaxRegionBytes ||
      data_bytes / region_bytes < kMinRegions)
    return Status::InvalidArgument("region size " + std::to_string(region_bytes) +
                                   " is not a multiple of 4 KiB in [1 MiB, 256 MiB] leaving at least 8 regions");

  AlignedBuffer buf;
  if (!buf.reserve(kBlockSize)) return Status::IoError("out of memory");
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
  s = dev->write(0, buf.data(), kBlockSize);
  if (s.ok()) s = dev->sync();
  if (s.ok())
    ADP_INFO("formatted card %s: %u regions of %" PRIu64 " MiB", path.c_str(), sb.num_regions, region_bytes >> 20);
  return s;
}

CardStore::CardStore(std::unique_ptr<CardDevice> dev, const Superblock& sb, bool durable)
    : device_(std::move(dev)),
      card_id_(sb.card_id),
      data_offset_(sb.data_offset),
      region_bytes_(sb.region_bytes),
      num_regions_(sb.num_regions),
      durable_(durable),
      regions_(sb.num_regions) {}

CardStore::~CardStore() = default;

Status CardStore::Open(const CardOptions& opts, std::unique_ptr<CardStore>* out) {
  AlignedBuffer buf;
  if (!buf.reserve(kBlockSize)) return Status::IoError("out of memory");
  Superblock sb{};
  for (int attempt = 0; attempt < 2; attempt++) {
    {
      std::unique_ptr<CardDevice> dev;
      Status s = CardDevice::Open(opts.path, opts.create_bytes, &dev);
      if (!s.ok()) return s;
      s = dev->read(0, buf.data(), kBlockSize);
      if (!s.ok()) return s;
      std::memcpy(&sb, buf.data(), sizeof sb);
      if (valid_superblock(sb)) {
        if (sb.format_version != kFormatVersion)
          return Status::InvalidArgument("card " + opts.path + " has format version " +
                                         std::to_string(sb.format_version) + "; this build reads version " +
                                         std::to_string(kFormatVersion));
        if (sb.card_bytes > dev->size() || sb.block_size != kBlockSize || sb.data_offset != kDataOffset ||
            sb.region_bytes < kMinRegionBytes || sb.region_bytes > kMaxRegionBytes ||
            sb.data_offset + uint64_t(sb.num_regions) * sb.region_bytes > dev->size())
          return Status::Corruption("superblock of card " + opts.path + " does not match the device (" +
                                    std::to_string(dev->size()) + " bytes); reformat with `lmcache-adp format`");
        dev->set_io_depth(opts.io_depth);
        std::unique_ptr<CardStore> store(new CardStore(std::move(dev), sb, opts.durable));
        s = store->recover(std::max(1, opts.recovery_threads));
        if (!s.ok()) return s;
        *out = std::move(store);
        return Status::Ok();
      }
      if (!all_zero(buf.data(), kBlockSize))
        return Status::InvalidArgument("card " + opts.path +
                                       " holds data that is not an ADP card; refusing to overwrite it (use "
                                       "`lmcache-adp format` to wipe it)");
    }
    // Blank card: format it, then open again (the device lock was dropped above).
    Status s = Format(opts.path, opts.create_bytes, opts.region_bytes);
    if (!s.ok()) return s;
  }
  return Status::Corruption("card " + opts.path + " could not be formatted");
}

Status CardStore::recover(int threads) {
  auto t0 = Clock::now();
  struct Found {
    uint64_t hash, seq, payload_bytes;
    uint32_t region, block;
  };
  struct RegionScan {
    bool valid = false;
    uint64_t epoch = 0, end = 0;
    std::vector<Found> objects;
  };
  std::vector<RegionScan> scans(num_regions_);
  std::atomic<uint32_t> next{0}, done{0};
  std::atomic<uint64_t> found{0};
  std::mutex err_mu;
  Status first_error;  // guarded by err_mu
  std::atomic<bool> failed{false};
  auto fail = [&](const Status& st) {
    std::lock_guard<std::mutex> l(err_mu);
    if (first_error.ok()) first_error = st;
    failed = true;
  };

  auto worker = [&] {
    AlignedBuffer block;
    if (!block.reserve(kBlockSize)) return fail(Status::IoError("out of memory for recovery"));
    for (uint32_t r; (r = next.fetch_add(1)) < num_regions_; done++) {
      RegionScan& scan = scans[r];
      uint64_t base = region_offset(r);
      Status s = device_->read(base, block.data(), kBlockSize);
      RegionHeader rh{};
      std::memcpy(&rh, block.data(), sizeof rh);
      if (s.ok() && std::memcmp(rh.magic, kRegionMagic, 8) == 0 && rh.card_id == card_id_ && rh.region_index == r &&
          rh.crc == region_crc(rh)) {
        scan.valid = true;
        scan.epoch = rh.epoch;
        uint64_t off = kBlockSize;
        while (s.ok() && off + kBlockSize <= region_bytes_) {
          s = device_->read(base + off, block.data(), kBlockSize);
          ObjectHeader h;
          if (!s.ok() || !decode_header(block.data(), card_id_, rh.epoch, &h)) break;
          uint64_t fp = object_footprint(h.payload_bytes);
          if (off + fp > region_bytes_) break;
          if (!(h.flags & kObjectDeleted)) {
            std::string_view key(reinterpret_cast<const char*>(block.data()) + sizeof h, h.key_bytes);
            scan.objects.push_back({hash_key(key), h.seq, h.payload_bytes, r, static_cast<uint32_t>(off / kBlockSize)});
            found++;
          }
          off += fp;
        }
        scan.end = off;
      }
      if (!s.ok()) fail(s);
    }
  };
  int n = std::min<int>(threads, static_cast<int>(num_regions_));
  std::vector<std::thread> pool;
  for (int i = 0; i < n; i++) pool.emplace_back(worker);
  // Progress for long recoveries: a line every 5 seconds.
  auto last_report = Clock::now();
  while (done.load() < num_regions_ && !failed.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (seconds_since(last_report) >= 5) {
      last_report = Clock::now();
      ADP_INFO("recovering card %s: %u/%u regions scanned, %" PRIu64 " objects so far", path().c_str(), done.load(),
               num_regions_, found.load());
    }
  }
  for (auto& t : pool) t.join();
  if (!first_error.ok()) {
    count_io_error();
    return Status::IoError("recovery of card " + path() + " failed: " + first_error.message());
  }

  // Merge: the highest sequence number of a key wins; older copies are
  // marked deleted on the card so a later delete cannot resurrect them.
  std::vector<Location> stale;
  for (auto& scan : scans) {
    for (const Found& f : scan.objects) {
      next_seq_ = std::max(next_seq_, f.seq + 1);
      IndexEntry e{f.region, f.block, static_cast<uint32_t>(f.payload_bytes), 0, f.seq};
      auto [it, inserted] = index_.try_emplace(f.hash, e);
      if (!inserted) {
        const IndexEntry& loser = it->second.seq < f.seq ? it->second : e;
        stale.push_back({loser.region, uint64_t(loser.block) * kBlockSize, scans[loser.region].epoch, loser.seq,
                         loser.payload_bytes});
        if (it->second.seq < f.seq) it->second = e;
      }
    }
  }
  for (uint32_t r = 0; r < num_regions_; r++) {
    Region& reg = regions_[r];
    const RegionScan& scan = scans[r];
    if (scan.valid) next_epoch_ = std::max(next_epoch_, scan.epoch + 1);
    if (scan.valid && scan.end > kBlockSize) {
      reg.state = RegionState::kSealed;
      reg.epoch = scan.epoch;
      reg.write_offset = scan.end;
      reg.last_access = scan.epoch;  // eviction order after restart: write order
    } else {
      free_regions_.push_back(r);
    }
  }
  for (auto& [hash, e] : index_) {
    Region& reg = regions_[e.region];
    reg.live_bytes += object_footprint(e.payload_bytes);
    reg.hashes.push_back(hash);
    used_bytes_ += object_footprint(e.payload_bytes);
  }
  clock_ = next_epoch_;
  std::reverse(free_regions_.begin(), free_regions_.end());  // hand out low regions first

  if (!stale.empty()) {
    IoContext ctx;
    for (const Location& loc : stale) {
      Status s = write_tombstone(ctx, loc);
      if (!s.ok()) return Status::IoError("recovery of card " + path() + " failed: " + s.message());
    }
  }
  recovered_objects_ = index_.size();
  recovery_seconds_ = seconds_since(t0);
  ADP_INFO("opened card %s: recovered %zu objects (%.2f of %.2f GiB used, %u regions of %" PRIu64 " MiB) in %.3f s",
           path().c_str(), index_.size(), used_bytes_ / double(1ull << 30),
           num_regions_ * double(region_bytes_) / double(1ull << 30), num_regions_, region_bytes_ >> 20,
           recovery_seconds_);
  return Status::Ok();
}

void CardStore::erase_entry_locked(uint64_t hash, const IndexEntry& e) {
  uint64_t fp = object_footprint(e.payload_bytes);
  regions_[e.region].live_bytes -= fp;
  used_bytes_ -= fp;
  index_.erase(hash);
}

void CardStore::evict_locked(uint32_t r) {
  Region& reg = regions_[r];
  uint64_t evicted = 0;
  for (uint64_t h : reg.hashes) {
    auto it = index_.find(h);
    if (it != index_.end() && it->second.region == r) {
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

Status CardStore::open_region(IoContext& ctx, uint32_t* region) {
  uint32_t r;
  uint64_t epoch;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    for (;;) {
      if (!free_regions_.empty()) {
        r = free_regions_.back();
        free_regions_.pop_back();
        break;
      }
      // Victim: an unpinned sealed region, empty ones first, then least recently used.
      int64_t victim = -1;
      for (uint32_t i = 0; i < num_regions_; i++) {
        const Region& c = regions_[i];
        if (c.state != RegionState::kSealed || c.pins) continue;
        if (victim < 0) {
          victim = i;
          continue;
        }
        const Region& v = regions_[victim];
        bool c_empty = c.live_bytes == 0, v_empty = v.live_bytes == 0;
        if (c_empty != v_empty ? c_empty : c.last_access < v.last_access) victim = i;
      }
      if (victim >= 0) {
        r = static_cast<uint32_t>(victim);
        evict_locked(r);
        break;
      }
      if (unpinned_.wait_until(lock, deadline) == std::cv_status::timeout)
        return Status::NoSpace("card " + path() + " is full and every region is being written or read");
    }
    Region& reg = regions_[r];
    reg.state = RegionState::kOpen;
    reg.epoch = epoch = next_epoch_++;
    reg.write_offset = kBlockSize;
    reg.live_bytes = 0;
    reg.last_access = ++clock_;
  }
  std::memset(ctx.header_.data(), 0, kBlockSize);
  RegionHeader rh{};
  std::memcpy(rh.magic, kRegionMagic, 8);
  rh.card_id = card_id_;
  rh.epoch = epoch;
  rh.region_index = r;
  rh.crc = region_crc(rh);
  std::memcpy(ctx.header_.data(), &rh, sizeof rh);
  Status s = device_->write(region_offset(r), ctx.header_.data(), kBlockSize);
  if (!s.ok()) {
    count_io_error();
    std::lock_guard<std::mutex> lock(mu_);
    regions_[r].state = RegionState::kFree;
    free_regions_.push_back(r);
    return s;
  }
  *region = r;
  return Status::Ok();
}

void CardStore::release_region(IoContext& ctx) {
  if (ctx.open_region_ < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Region& reg = regions_[ctx.open_region_];
  if (reg.write_offset > kBlockSize) {
    reg.state = RegionState::kSealed;
  } else {
    reg.state = RegionState::kFree;
    free_regions_.push_back(static_cast<uint32_t>(ctx.open_region_));
  }
  ctx.open_region_ = -1;
  unpinned_.notify_all();
}

Status CardStore::reserve(IoContext& ctx, uint64_t footprint, uint32_t* region, uint64_t* offset, uint64_t* epoch) {
  if (ctx.open_region_ >= 0) {
    std::lock_guard<std::mutex> lock(mu_);
    Region& reg = regions_[ctx.open_region_];
    if (reg.write_offset + footprint <= region_bytes_) {
      *region = static_cast<uint32_t>(ctx.open_region_);
      *offset = reg.write_offset;
      *epoch = reg.epoch;
      reg.write_offset += footprint;
      return Status::Ok();
    }
  }
  release_region(ctx);
  uint32_t r;
  Status s = open_region(ctx, &r);
  if (!s.ok()) return s;
  ctx.open_region_ = r;
  std::lock_guard<std::mutex> lock(mu_);
  Region& reg = regions_[r];
  *region = r;
  *offset = reg.write_offset;
  *epoch = reg.epoch;
  reg.write_offset += footprint;
  return Status::Ok();
}

void CardStore::put(IoContext& ctx, const PutItem* items, size_t n, Status* results,
                    const std::function<bool()>& still_wanted) {
  ctx.store_ = this;
  if (!ctx.header_.reserve(2 * kBlockSize)) {
    for (size_t i = 0; i < n; i++) results[i] = Status::IoError("out of memory for staging");
    return;
  }
  std::vector<Location> written;  // parallel to items; region == UINT32_MAX if not written
  written.resize(n, Location{UINT32_MAX, 0, 0, 0, 0});
  // Regions holding this put's objects stay pinned until the commit: a region
  // sealed by a later item would otherwise look empty and be evicted (and
  // rewritten) before its objects are indexed.
  std::vector<uint32_t> pinned;
  bool any_written = false;
  for (size_t i = 0; i < n; i++) {
    const PutItem& it = items[i];
    results[i] = check_key(it.key);
    if (!results[i].ok()) continue;
    if (it.size > max_object_bytes()) {
      if (!oversize_logged_.exchange(true))
        ADP_ERROR("card %s refuses objects larger than %" PRIu64
                  " bytes (one region); got one of %zu bytes: "
                  "format a larger card (regions grow with the card, up to 256 MiB)",
                  path().c_str(), max_object_bytes(), it.size);
      results[i] = Status::NoSpace(
          "object of " + std::to_string(it.size) + " bytes is larger than the largest object the card " + path() +
          " holds (" + std::to_string(max_object_bytes()) + " bytes: one region of " + std::to_string(region_bytes_) +
          " bytes, card of " + std::to_string(uint64_t(num_regions_) * region_bytes_) + " bytes)");
      continue;
    }
    uint64_t fp = object_footprint(it.size);
    // Zero-copy when the caller's memory suits O_DIRECT: header block, the
    // aligned body straight from the caller, the tail through a block of ours.
    // Otherwise the whole object is staged.
    bool aligned = (reinterpret_cast<uintptr_t>(it.data) % kBlockSize) == 0 && it.size >= kBlockSize;
    if (!aligned && !ctx.staging_.reserve(fp)) {
      results[i] = Status::IoError("out of memory for staging");
      continue;
    }
    uint32_t region;
    uint64_t offset, epoch;
    Status s = reserve(ctx, fp, &region, &offset, &epoch);
    if (!s.ok()) {
      results[i] = s;
      continue;
    }
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seq = next_seq_++;
      regions_[region].pins++;
    }
    pinned.push_back(region);
    iovec iov[3];
    int iovcnt;
    if (aligned) {
      uint32_t pcrc = crc32c(it.data, it.size);
      uint8_t* hdr = ctx.header_.data();
      encode_header(hdr, card_id_, epoch, seq, it.key, it.size, pcrc, 0);
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
      encode_header(st, card_id_, epoch, seq, it.key, it.size, pcrc, 0);
      std::memset(st + kBlockSize + it.size, 0, fp - kBlockSize - it.size);
      iov[0] = {st, fp};
      iovcnt = 1;
    }
    s = device_->writev(region_offset(region) + offset, iov, iovcnt);
    if (!s.ok()) {
      count_io_error();
      results[i] = s;
      // The failed extent breaks the region's chain: what came after it would
      // be invisible to recovery. Seal the region; the next item opens another.
      release_region(ctx);
      continue;
    }
    counters_.bytes_written += fp;
    written[i] = {region, offset, epoch, seq, it.size};
    any_written = true;
  }
  if (any_written && durable_) {
    Status s = device_->sync();
    if (!s.ok()) {
      count_io_error();
      for (size_t i = 0; i < n; i++)
        if (written[i].region != UINT32_MAX) results[i] = s, written[i].region = UINT32_MAX;
    }
  }

  // Commit: make the written objects visible, unless the caller gave up.
  bool wanted = still_wanted();
  std::vector<Location> superseded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; i++) {
      const Location& loc = written[i];
      if (loc.region == UINT32_MAX) continue;
      Region& reg = regions_[loc.region];
      if (!wanted) {
        reg.pins++;
        superseded.push_back(loc);
        continue;
      }
      uint64_t h = hash_key(items[i].key);
      IndexEntry e{loc.region, static_cast<uint32_t>(loc.offset / kBlockSize), static_cast<uint32_t>(loc.payload_bytes),
                   0, loc.seq};
      auto [it, inserted] = index_.try_emplace(h, e);
      if (!inserted) {
        const IndexEntry& old = it->second;
        regions_[old.region].pins++;
        superseded.push_back(
            {old.region, uint64_t(old.block) * kBlockSize, regions_[old.region].epoch, old.seq, old.payload_bytes});
        erase_entry_locked(h, old);
        index_.emplace(h, e);
      }
      uint64_t fp = object_footprint(loc.payload_bytes);
      reg.live_bytes += fp;
      reg.hashes.push_back(h);
      used_bytes_ += fp;
      counters_.stores++;
    }
    for (uint32_t r : pinned)
      if (--regions_[r].pins == 0) unpinned_.notify_all();
  }
  for (const Location& loc : superseded) {
    Status s = write_tombstone(ctx, loc);
    if (!s.ok()) count_io_error();
    unpin(loc.region);
  }
  if (!wanted)
    for (size_t i = 0; i < n; i++)
      if (written[i].region != UINT32_MAX) results[i] = Status::TimedOut("store abandoned: deadline passed");
  for (size_t i = 0; i < n; i++)
    if (!results[i].ok()) counters_.store_failures++;
}

void CardStore::unpin(uint32_t r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--regions_[r].pins == 0) unpinned_.notify_all();
}

Status CardStore::write_tombstone(IoContext& ctx, const Location& loc) {
  if (!ctx.header_.reserve(2 * kBlockSize)) return Status::IoError("out of memory for staging");
  encode_header(ctx.header_.data(), card_id_, loc.epoch, loc.seq, std::string_view(), loc.payload_bytes, 0,
                kObjectDeleted);
  return device_->write(region_offset(loc.region) + loc.offset, ctx.header_.data(), kBlockSize);
}

std::string CardStore::read_and_check(IoContext& ctx, uint64_t hash, const IndexEntry& e, Status* io,
                                      bool check_payload) {
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Checked under the same lock as the pin: once unlocked after a lookup,
    // the entry's region may have been evicted and reused under a new epoch.
    auto it = index_.find(hash);
    if (it == index_.end() || it->second.seq != e.seq) {
      *io = Status::NotFound("evicted, replaced or deleted meanwhile");
      return std::string();
    }
    Region& reg = regions_[e.region];
    reg.pins++;
    reg.last_access = ++clock_;
    epoch = reg.epoch;
  }
  uint64_t fp = object_footprint(e.payload_bytes);
  *io = ctx.staging_.reserve(fp)
            ? device_->read(region_offset(e.region) + uint64_t(e.block) * kBlockSize, ctx.staging_.data(), fp)
            : Status::IoError("out of memory for staging");
  unpin(e.region);
  if (!io->ok()) {
    count_io_error();
    return io->message();
  }
  counters_.bytes_read += fp;
  const uint8_t* block = ctx.staging_.data();
  ObjectHeader hdr;
  if (!decode_header(block, card_id_, epoch, &hdr)) return "header damaged";
  if ((hdr.flags & kObjectDeleted) && hdr.seq == e.seq) {  // our own tombstone: deleted or superseded while we read
    *io = Status::NotFound("deleted meanwhile");
    return std::string();
  }
  if ((hdr.flags & kObjectDeleted) || hdr.seq != e.seq || hdr.payload_bytes != e.payload_bytes)
    return "header does not match the index";
  if (hash_key(std::string_view(reinterpret_cast<const char*>(block) + sizeof hdr, hdr.key_bytes)) != hash)
    return "key does not match the index";
  if (check_payload && crc32c(block + kBlockSize, hdr.payload_bytes) != hdr.payload_crc)
    return "payload checksum mismatch";
  return std::string();
}

void CardStore::drop_damaged(IoContext& ctx, uint64_t hash, const IndexEntry& e) {
  counters_.checksum_failures++;
  Location loc{e.region, uint64_t(e.block) * kBlockSize, 0, e.seq, e.payload_bytes};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(hash);
    if (it == index_.end() || it->second.seq != e.seq) return;  // already replaced or gone
    erase_entry_locked(hash, it->second);
    regions_[e.region].pins++;
    loc.epoch = regions_[e.region].epoch;
  }
  Status ts = write_tombstone(ctx, loc);
  if (!ts.ok()) count_io_error();
  unpin(e.region);
}

Status CardStore::get(IoContext& ctx, std::string_view key, const DeliverPayloadFn& deliver) {
  ctx.store_ = this;
  Status ks = check_key(key);
  if (!ks.ok()) return ks;
  uint64_t h = hash_key(key);
  IndexEntry e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(h);
    if (it == index_.end()) {
      counters_.misses++;
      return Status::NotFound();
    }
    e = it->second;
  }
  Status io;
  std::string bad = read_and_check(ctx, h, e, &io, false);
  if (io.is_not_found()) counters_.misses++;
  if (!io.ok()) return io;
  const uint8_t* block = ctx.staging_.data();
  ObjectHeader hdr;
  std::memcpy(&hdr, block, sizeof hdr);
  if (bad.empty() && std::string_view(reinterpret_cast<const char*>(block) + sizeof hdr, hdr.key_bytes) != key) {
    counters_.misses++;  // another key with the same 64-bit hash
    return Status::NotFound();
  }
  bool delivered = false;
  if (bad.empty()) {
    const uint8_t* payload = block + kBlockSize;
    delivered = deliver(hdr.payload_bytes, [&](uint8_t* dst) {
      if (crc32c_copy(dst, payload, hdr.payload_bytes) == hdr.payload_crc) return true;
      bad = "payload checksum mismatch";
      return false;
    });
  }
  if (!bad.empty()) {
    counters_.misses++;
    ADP_WARN("object at region %u offset %" PRIu64 " of card %s: %s; dropped, served as a miss", e.region,
             uint64_t(e.block) * kBlockSize, path().c_str(), bad.c_str());
    drop_damaged(ctx, h, e);
    return Status::NotFound();
  }
  if (!delivered) {
    counters_.misses++;
    return Status::NotFound("not delivered");
  }
  counters_.hits++;
  return Status::Ok();
}

void CardStore::verify(IoContext& ctx, bool repair, const std::function<void(uint64_t, uint64_t)>& progress,
                       VerifyReport* report) {
  ctx.store_ = this;
  std::vector<std::pair<uint64_t, IndexEntry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries.assign(index_.begin(), index_.end());
  }
  // Card order: regions are read front to back.
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second.region, a.second.block) < std::tie(b.second.region, b.second.block);
  });
  uint64_t done = 0;
  for (const auto& [hash, e] : entries) {
    bool current;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = index_.find(hash);
      current = it != index_.end() && it->second.seq == e.seq;
    }
    if (current) {
      Status io;
      std::string bad = read_and_check(ctx, hash, e, &io, true);
      report->checked++;
      report->bytes += e.payload_bytes;
      if (!bad.empty()) {
        report->bad++;
        report->bad_objects.push_back("region " + std::to_string(e.region) + " offset " +
                                      std::to_string(uint64_t(e.block) * kBlockSize) + ": " + bad);
        if (repair && io.ok()) {
          drop_damaged(ctx, hash, e);
          report->repaired++;
        }
      }
    }
    progress(++done, entries.size());
  }
}

bool CardStore::exists(std::string_view key) {
  if (!check_key(key).ok()) return false;
  uint64_t h = hash_key(key);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(h);
  if (it == index_.end()) return false;
  regions_[it->second.region].last_access = ++clock_;
  return true;
}

bool CardStore::remove(IoContext& ctx, std::string_view key) {
  ctx.store_ = this;
  if (!check_key(key).ok()) return false;
  uint64_t h = hash_key(key);
  Location loc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(h);
    if (it == index_.end()) return false;
    const IndexEntry& e = it->second;
    regions_[e.region].pins++;
    loc = {e.region, uint64_t(e.block) * kBlockSize, regions_[e.region].epoch, e.seq, e.payload_bytes};
  }
  // The tombstone goes to the card first: a delete that is not on the card
  // is not reported as done (it would come back after a restart).
  Status s = write_tombstone(ctx, loc);
  bool erased = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(h);
    if (s.ok() && it != index_.end() && it->second.seq == loc.seq) {
      erase_entry_locked(h, it->second);
      erased = true;
    }
    if (--regions_[loc.region].pins == 0) unpinned_.notify_all();
  }
  if (!s.ok()) count_io_error();
  if (erased) counters_.deletes++;
  return erased;
}

StoreStats CardStore::stats() const {
  StoreStats st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st.used_bytes = used_bytes_;
    st.objects = index_.size();
    st.free_regions = free_regions_.size();
  }
  st.region_bytes = region_bytes_;
  st.num_regions = num_regions_;
  st.capacity_bytes = uint64_t(num_regions_) * region_bytes_;
  counters_.copy_to(&st);
  st.evicted_objects = counters_.evicted_objects;
  st.evicted_regions = counters_.evicted_regions;
  st.checksum_failures = counters_.checksum_failures;
  st.io_errors = counters_.io_errors;
  st.recovered_objects = recovered_objects_;
  st.recovery_seconds = recovery_seconds_;
  st.healthy = device_->healthy();
  return st;
}

}  // namespace adp
