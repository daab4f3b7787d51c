// SPDX-License-Identifier: Apache-2.0
#include "store/recovery.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "store/card_format.h"
#include "store/card_store.h"
#include "util/aligned_buffer.h"
#include "util/log.h"

namespace adp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Walks region r's chain into *scan.
Status scan_region(const Device& dev, const CardGeometry& g, uint32_t r, uint8_t* block, RegionScan* scan) {
  uint64_t base = g.region_offset(r);
  Status s = dev.read(base, block, kBlockSize);
  RegionHeader rh{};
  if (!s.ok() || !decode_region_header(block, g.card_id, r, &rh)) return s;
  scan->end = kBlockSize;
  scan->valid = true;
  scan->epoch = rh.epoch;
  uint64_t off = kBlockSize;
  while (off + kBlockSize <= g.region_bytes) {
    s = dev.read(base + off, block, kBlockSize);
    ObjectHeader h;
    if (!s.ok() || !decode_object_header(block, g.card_id, rh.epoch, &h)) break;
    if (h.payload_bytes > g.region_bytes) break;  // bounded before it is used
    uint64_t fp = object_footprint(h.payload_bytes);
    if (off + fp > g.region_bytes) break;
    bool deleted = h.flags & kObjectDeleted;
    scan->objects.push_back({deleted ? h.key_hash : hash_key(object_key(block, h)), h.seq, h.payload_bytes, r,
                             static_cast<uint32_t>(off / kBlockSize), deleted});
    off += fp;
  }
  scan->end = off;
  return s;
}

}  // namespace

Status scan_regions(const Device& dev, const CardGeometry& g, int threads, std::vector<RegionScan>* scans) {
  scans->assign(g.num_regions, RegionScan{});
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
    for (uint32_t r; (r = next.fetch_add(1)) < g.num_regions; done++) {
      RegionScan& scan = (*scans)[r];
      scan.io = scan_region(dev, g, r, block.data(), &scan);
      found += scan.objects.size();
    }
  };
  int n = std::clamp<int>(threads, 1, static_cast<int>(g.num_regions));
  std::vector<std::thread> pool;
  for (int i = 0; i < n; i++) pool.emplace_back(worker);
  // Progress for long recoveries: a line every 5 seconds.
  auto last_report = Clock::now();
  while (done.load() < g.num_regions && !failed.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (seconds_since(last_report) >= 5) {
      last_report = Clock::now();
      ADP_INFO("recovering card %s: %u/%u regions scanned, %" PRIu64 " objects so far", dev.path().c_str(), done.load(),
               g.num_regions, found.load());
    }
  }
  for (auto& t : pool) t.join();
  return first_error;
}

Status CardStore::recover(int threads) {
  auto t0 = Clock::now();
  CardGeometry g{card_id_, data_offset_, region_bytes_, num_regions_};
  std::vector<RegionScan> scans;
  Status scan_status = scan_regions(*device_, g, threads, &scans);
  if (!scan_status.ok()) {
    count_io_error();
    return Status::IoError("recovery of card " + path() + " failed: " + scan_status.message());
  }

  // Damaged media costs what it holds: the region keeps what was found
  // before the failed read (or is free, if its header could not be read).
  uint64_t damaged = 0;
  for (uint32_t r = 0; r < num_regions_; r++) {
    const RegionScan& scan = scans[r];
    if (scan.io.ok()) continue;
    if (damaged++ == 0)
      ADP_ERROR(
          "card %s: region %u cannot be read (%s); its objects from there on are lost, the rest of the card is "
          "served (`lmcache-adp verify` checks every object)",
          path().c_str(), r, scan.io.message().c_str());
  }
  if (damaged > 1) ADP_ERROR("card %s: %" PRIu64 " regions had unreadable blocks", path().c_str(), damaged);
  counters_.media_errors += damaged;
  counters_.io_errors += damaged;

  // Merge: every key is resolved by sequence number across its copies and
  // its tombstones. The highest wins; if that is a tombstone the key stays
  // deleted. Older live copies are marked deleted on the card, so that they
  // cannot come back once the winner's region is reused.
  struct Winner {
    uint64_t seq;
    uint32_t region;
    bool deleted;
  };
  std::unordered_map<uint64_t, Winner> winners;
  for (const RegionScan& scan : scans) {
    for (const RecoveredObject& f : scan.objects) {
      next_seq_ = std::max(next_seq_, f.seq + 1);
      auto [it, inserted] = winners.try_emplace(f.hash, Winner{f.seq, f.region, f.deleted});
      if (!inserted && it->second.seq < f.seq) it->second = {f.seq, f.region, f.deleted};
    }
  }
  std::vector<Stale> stale;
  for (const RegionScan& scan : scans) {
    for (const RecoveredObject& f : scan.objects) {
      if (f.deleted) continue;
      const Winner& w = winners[f.hash];
      if (w.seq == f.seq && !w.deleted) {
        index_.emplace(f.hash, IndexEntry{f.region, f.block, static_cast<uint32_t>(f.payload_bytes), 0, f.seq});
      } else {
        stale.push_back({{f.region, uint64_t(f.block) * kBlockSize, scan.epoch, f.seq, f.payload_bytes, f.hash},
                         static_cast<int64_t>(w.region)});
      }
    }
  }
  winners = {};
  uint64_t next_epoch = 1;
  std::vector<uint32_t> unreadable;
  for (uint32_t r = 0; r < num_regions_; r++) {
    const RegionScan& scan = scans[r];
    if (scan.valid) next_epoch = std::max(next_epoch, scan.epoch + 1);
    if (scan.valid && scan.end > kBlockSize)
      regions_.restore_sealed(r, scan.epoch, scan.end);
    else if (scan.io.ok())
      regions_.add_free(r);
    else
      unreadable.push_back(r);
  }
  regions_.finish_recovery(next_epoch);
  for (uint32_t r : unreadable) regions_.add_free_last(r);
  index_.for_each([this](uint64_t hash, const IndexEntry& e) {
    RegionManager::Region& reg = regions_[e.region];
    reg.live_bytes += object_footprint(e.payload_bytes);
    reg.hashes.push_back(hash);
    used_bytes_ += object_footprint(e.payload_bytes);
  });
  for (uint32_t r = 0; r < num_regions_; r++) regions_[r].hashes.shrink_to_fit();

  if (!stale.empty()) {
    for (const Stale& st : stale) {
      regions_.pin(st.loc.region);
      regions_.pin(static_cast<uint32_t>(st.guard));
    }
    IoContext ctx;
    if (!write_tombstones(ctx, stale))
      ADP_WARN("card %s: %zu older copies could not be marked deleted yet; their newer copies are kept until they are",
               path().c_str(), pending_.size());
  }
  // The scans and the merge's map were freed: give that memory back to the
  // system, or the process keeps it (about 50 bytes per object recovered).
  scans = {};
  malloc_trim(0);
  recovered_objects_ = index_.size();
  recovery_seconds_ = seconds_since(t0);
  ADP_INFO("opened card %s: recovered %zu objects (%.2f of %.2f GiB used, %u regions of %" PRIu64 " MiB) in %.3f s",
           path().c_str(), index_.size(), used_bytes_ / double(1ull << 30),
           num_regions_ * double(region_bytes_) / double(1ull << 30), num_regions_, region_bytes_ >> 20,
           recovery_seconds_);
  return Status::Ok();
}

}  // namespace adp
