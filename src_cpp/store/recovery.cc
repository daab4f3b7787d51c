// SPDX-License-Identifier: Apache-2.0
#include "store/recovery.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>

#include "store/card_format.h"
#include "store/card_store.h"
#include "store/index_hash.h"
#include "store/recovery_damage.h"
#include "util/aligned_buffer.h"
#include "util/amount.h"
#include "util/log.h"
#include "util/thread_name.h"

namespace adp {

RecoveredObject recovered_record(const uint8_t* block, const ObjectHeader& h, uint32_t region, uint64_t offset,
                                 bool spans) {
  const bool deleted = h.flags & kObjectDeleted, keyless = deleted && h.key_bytes == 0;
  RecoveredObject f{keyless ? 0 : index_hash(object_key(block, h)),
                    h.seq,
                    h.payload_bytes,
                    region,
                    static_cast<uint32_t>(offset / kBlockSize),
                    deleted,
                    spans};
  f.keyless = keyless;
  f.key_hash = h.key_hash;
  return f;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Status scan_region(const Device& dev, const CardGeometry& g, uint32_t r, uint8_t* block, RegionScan* scan) {
  uint64_t base = g.region_offset(r);
  Status s = dev.read(base, block, kBlockSize);
  RegionHeader rh{};
  if (!s.ok()) return s;
  if (!decode_region_header(block, g.card_id, r, &rh)) {
    note_region_header_damage(block, g.card_id, scan);
    return s;
  }
  if (rh.cont_bytes > g.region_bytes - kBlockSize || rh.cont_bytes % kBlockSize) {  // bounded before use
    note_cont_bytes_damage(rh, scan);
    return s;
  }
  scan->valid = true;
  scan->epoch = rh.epoch;
  scan->prev_region = rh.prev_region;
  scan->prev_epoch = rh.prev_epoch;
  scan->cont_bytes = rh.cont_bytes;
  uint64_t off = kBlockSize + rh.cont_bytes;
  scan->end = off;
  while (off + kBlockSize <= g.region_bytes) {
    s = dev.read(base + off, block, kBlockSize);
    ObjectHeader h;
    if (!s.ok()) {
      // No crash leaves a block that cannot be read (a cut leaves its older bytes or its new ones): damage, which
      // costs the record whose header it is, as one that reads back wrong does (since session 33; until then the
      // walk ended here and the rest of the region was lost, review33a F4). The walk resumes at the next header of
      // the epoch that checks out; the span is padded by a read-write open (recover).
      if (scan->io.ok()) scan->io = s;
      off = skip_damage(dev, g, r, rh.epoch, off, nullptr, block, scan);
      continue;
    }
    if (const char* bad = check_walked_header(block, g, rh.epoch, off, &h)) {
      // A crash's cut (older bytes there) ends the walk: the stores behind
      // it were never acknowledged. Damage (this card's header of this
      // epoch, once whole and valid) costs its own record only: the walk
      // resumes at the next header of the epoch that checks out.
      if (!damaged_object_header(block, g.card_id, rh.epoch)) {
        scan->cut_at = off;
        break;
      }
      off = skip_damage(dev, g, r, rh.epoch, off, bad, block, scan);
      continue;
    }
    bool spans = record_continues(off, h.payload_bytes, g.region_bytes);
    if (!(h.flags & kObjectPad))  // a pad is an abandoned reservation: stepped over
      scan->objects.push_back(recovered_record(block, h, r, off, spans));
    off = spans ? g.region_bytes : off + object_footprint(h.payload_bytes);
    scan->end = off;
  }
  return scan->io;  // the first block that could not be read, if any
}

}  // namespace

Status scan_regions(const Device& dev, const CardGeometry& g, int threads, std::vector<RegionScan>* scans) {
  scans->assign(g.num_regions, RegionScan{});
  std::atomic<uint32_t> next{0}, done{0};
  std::atomic<uint64_t> found{0};
  std::mutex mu;
  std::condition_variable all_exited;
  int exited = 0;  // guarded by mu: workers returned
  // A worker out of memory (its block, or std::bad_alloc: a region's records, a failure's text) fails the scan with
  // "out of memory for recovery", made on the calling thread (session 29: the exception ended the process on a scan
  // thread, std::terminate). The Status is made by the caller: it allocates too.
  std::atomic<bool> out_of_memory{false};
  auto worker = [&] {
    try {
      AlignedBuffer block;
      if (!block.reserve(kBlockSize))
        out_of_memory = true;
      else
        for (uint32_t r; (r = next.fetch_add(1)) < g.num_regions; done++) {
          RegionScan& scan = (*scans)[r];
          scan.io = scan_region(dev, g, r, block.data(), &scan);
          found += scan.objects.size();
        }
    } catch (const std::bad_alloc&) {
      out_of_memory = true;
      next = g.num_regions;  // the others stop at their next region: the scan fails
    }
    std::lock_guard<std::mutex> l(mu);
    exited++;
    all_exited.notify_one();  // under mu: the waiter cannot return and destroy it first
  };
  const int want = std::clamp<int>(threads, 1, static_cast<int>(g.num_regions));
  std::vector<std::thread> pool;
  pool.reserve(want);
  for (int i = 0; i < want; i++) {
    try {
      pool.emplace_back([&] {
        set_thread_name("adp-recover");
        worker();
      });
    } catch (const std::exception& e) {
      // No more threads (std::system_error: a pids limit, memory; std::bad_alloc: a thread's state): the walk goes
      // on with those it got, or on this thread. Thrown, the exception ended the process (a joinable thread
      // destroyed: std::terminate) or failed the open.
      ADP_WARN("recovering card %s: %zu of %d scan threads started (%s); %s", dev.path().c_str(), pool.size(), want,
               e.what(), pool.empty() ? "the opening thread walks the card itself" : "they walk it");
      break;
    }
  }
  const int n = pool.empty() ? 1 : static_cast<int>(pool.size());
  if (pool.empty()) worker();
  // Woken by the last worker's exit, so an open waits for its walk only;
  // a line of progress every 5 seconds of a long one.
  {
    std::unique_lock<std::mutex> l(mu);
    while (!all_exited.wait_for(l, std::chrono::seconds(5), [&] { return exited == n; }))
      ADP_INFO("recovering card %s: %u/%u regions scanned, %" PRIu64 " objects so far", dev.path().c_str(), done.load(),
               g.num_regions, found.load());
  }
  for (auto& t : pool) t.join();
  if (out_of_memory) return Status::IoError("out of memory for recovery", Status::IoClass::kGatewayMemory);
  return Status::Ok();
}

Status CardStore::recover(int threads) {
  auto t0 = Clock::now();
  CardGeometry g{card_id_, data_offset_, region_bytes_, num_regions_};
  std::vector<RegionScan> scans;
  Status scan_status = scan_regions(*device_, g, threads, &scans);
  if (!scan_status.ok()) {
    count_failure(scan_status);
    return Status::IoError("recovery of card " + path() + " failed: " + scan_status.message(), scan_status.io_class());
  }

  // Damaged media costs what it holds: the records whose header blocks cannot be read (the walk went on behind
  // them), or the region, free, if its header cannot be read.
  uint64_t damaged = 0;
  for (uint32_t r = 0; r < num_regions_; r++) {
    const RegionScan& scan = scans[r];
    if (scan.io.ok()) continue;
    if (damaged++) continue;
    if (!scan.valid)
      ADP_ERROR(
          "card %s: region %u's header cannot be read (%s); its objects are lost, the rest of the card is served "
          "(`lmcache-adp verify` checks every object)",
          path().c_str(), r, scan.io.message().c_str());
    else
      ADP_ERROR(
          "card %s: region %u, from offset %" PRIu64
          ": a block cannot be read (%s); the records whose headers lie "
          "there are lost (%zu spans), the walk went on behind them; the rest of the card is served (`lmcache-adp "
          "verify` checks every object)",
          path().c_str(), r, scan.unreadable.empty() ? uint64_t(0) : scan.unreadable.front().at,
          scan.io.message().c_str(), scan.unreadable.size());
  }
  if (damaged > 1) ADP_ERROR("card %s: %" PRIu64 " regions had unreadable blocks", path().c_str(), damaged);
  counters_.media_errors += damaged;
  counters_.io_errors += damaged;

  // The frontier's chain: succ[p] is the region whose header says the
  // frontier came to it from p (under p's current epoch). If a header write
  // that was reported failed still reached the card, two regions may name
  // the same predecessor: the later epoch is the one that was used.
  std::vector<uint32_t> succ(num_regions_, kNoRegion);
  for (uint32_t r = 0; r < num_regions_; r++) {
    const RegionScan& scan = scans[r];
    uint32_t p = scan.prev_region;
    if (!scan.valid || p >= num_regions_ || !scans[p].valid || scans[p].epoch != scan.prev_epoch) continue;
    if (succ[p] == kNoRegion || scans[succ[p]].epoch < scan.epoch) succ[p] = r;
  }
  // A record that continues past its region is kept only if every region it
  // continues into is still the frontier's next, holding exactly its bytes
  // (else a region it touched was reused or is damaged: the object is gone).
  // Tombstones are kept either way: they order a delete, whatever the bytes.
  std::vector<bool> used_by_span(num_regions_, false);
  for (RegionScan& scan : scans) {
    if (scan.objects.empty() || !scan.objects.back().spans) continue;
    RecoveredObject& f = scan.objects.back();
    uint64_t rem = uint64_t(f.block) * kBlockSize + object_footprint(f.payload_bytes) - region_bytes_;
    std::vector<uint32_t> path;
    for (uint32_t cur = f.region; rem;) {
      uint32_t nx = succ[cur];
      uint64_t take = std::min(rem, region_bytes_ - kBlockSize);
      if (nx == kNoRegion || scans[nx].cont_bytes != take) break;
      path.push_back(nx);
      rem -= take;
      cur = nx;
    }
    if (rem == 0) {
      for (uint32_t r : path) used_by_span[r] = true;
    } else if (!f.deleted) {
      scan.objects.pop_back();
    }
  }

  // Merge: every key is resolved by sequence number across its copies and
  // its tombstones, by its index hash (a tombstone keeps its key since
  // format 4). The highest wins; if that is a tombstone the key stays
  // deleted. A keyless tombstone of a format-3 build names only hash_key:
  // it outranks the older copies of every key of that hash_key, as that
  // build meant it. Older live copies are marked deleted on the card, so
  // that they cannot come back once the winner's region is reused.
  struct Winner {
    uint64_t seq;
    uint32_t region;
    bool deleted;
    uint32_t block = 0;
    uint64_t payload_bytes = 0;
  };
  std::unordered_map<uint64_t, Winner> winners;      // by index hash
  std::unordered_map<uint64_t, Winner> by_key_hash;  // keyless tombstones by hash_key (none on a format-4 card)
  auto newer = [](std::unordered_map<uint64_t, Winner>& m, uint64_t h, const RecoveredObject& f) {
    auto [it, inserted] = m.try_emplace(h, Winner{f.seq, f.region, f.deleted, f.block, f.payload_bytes});
    if (!inserted && it->second.seq < f.seq) it->second = {f.seq, f.region, f.deleted, f.block, f.payload_bytes};
  };
  for (const RegionScan& scan : scans) {
    for (const RecoveredObject& f : scan.objects) {
      next_seq_ = std::max(next_seq_, f.seq + 1);
      if (!f.keyless)
        newer(winners, f.hash, f);
      else if (f.key_hash)  // 0: over a damaged header, names nothing
        newer(by_key_hash, f.key_hash, f);
    }
  }
  // The record that outranks f (a newer copy or tombstone of its key), or null.
  auto outranked_by = [&](const RecoveredObject& f) -> const Winner* {
    const Winner* w = nullptr;
    if (auto it = winners.find(f.hash); it != winners.end() && it->second.seq > f.seq) w = &it->second;
    if (auto it = by_key_hash.find(f.key_hash); it != by_key_hash.end() && it->second.seq > f.seq)
      if (!w || it->second.seq > w->seq) w = &it->second;
    return w;
  };
  std::vector<Stale> stale;
  std::vector<Winner> outranking;  // stale[i]'s winner: its regions are that tombstone's guards (below)
  for (const RegionScan& scan : scans) {
    for (const RecoveredObject& f : scan.objects) {
      if (f.deleted) continue;
      if (const Winner* w = outranked_by(f)) {
        stale.push_back(
            {{f.region, uint64_t(f.block) * kBlockSize, scan.epoch, f.seq, f.payload_bytes, f.hash}, {}, {}});
        outranking.push_back(*w);
      } else {
        index_.emplace(f.hash, IndexEntry{f.region, f.block, static_cast<uint32_t>(f.payload_bytes), f.seq});
      }
    }
  }
  // Damage recovery can prove (not a crash's cut): counted, and what it
  // cost logged. The region itself is placed below as any other.
  DamageTotals dt =
      judge_damage(*device_, g, succ, &scans, [&](const RecoveredObject& f) { return outranked_by(f) != nullptr; });
  damaged_regions_ = dt.regions;
  damage_lost_objects_ = dt.objects;
  damage_lost_bytes_ = dt.bytes;
  damaged_spans_ = std::move(dt.spans);
  winners = {};
  by_key_hash = {};
  uint64_t next_epoch = 1;
  std::vector<uint32_t> unreadable, unseen;
  for (uint32_t r = 0; r < num_regions_; r++) {
    const RegionScan& scan = scans[r];
    if (scan.valid) next_epoch = std::max(next_epoch, scan.epoch + 1);
    // A header block not this card's (magic or card_id wrong) that no region
    // names is no damage (bytes from before the format look the same), but
    // the frontier's own header is one no region names: unseen as well.
    if (!scan.valid && (!scan.io.ok() || scan.damage == Damage::kRegionHeader || scan.foreign_header))
      unseen.push_back(r);
    if (scan.valid && (scan.end > kBlockSize + scan.cont_bytes || used_by_span[r]))
      regions_.restore_sealed(r, scan.epoch, scan.end);
    else if (scan.io.ok())
      regions_.add_free(r);
    else
      unreadable.push_back(r);
  }
  // A region header not walked (unreadable, damage: judge_damage, or not this card's): its
  // epoch, unseen, may be the newest, and the region, free now, may be the
  // first handed out. Reopened under that epoch, the records of its last
  // opening behind the new ones would be walked again (docs/card_format.md,
  // Recovery, "A region header not walked").
  if (!unseen.empty()) next_epoch += kUnseenEpochMargin;
  regions_.finish_recovery(next_epoch);
  for (uint32_t r : unreadable) regions_.add_free_last(r);
  // A crash's cut in a region kept: the stores reserved behind it were never
  // acknowledged (a store is once every one reserved before it is written),
  // but one whose write landed is still there, and its seq, behind the cut,
  // was not seen by this walk: stores from now on may get a lower one. A
  // later walk resumed behind damage in front of the cut would find it and
  // rank it above them (a key deleted after this restart back with that
  // copy). So would a later walk past a block this one could not read (an
  // error that passes), the records behind it lost now and their seqs
  // unseen, in the region kept or handed out last. A pad over the cut or the
  // unreadable block to the region's end hides them from every walk. Since
  // session 33 the walk goes on behind a block it cannot read (no cut: damage)
  // and finds the records there; the pad over the span it stepped over (from
  // the block, or the damaged header in front of it, to where it resumed)
  // hides only what that open could not see.
  std::vector<Cut> cuts;
  for (uint32_t r = 0; r < num_regions_; r++) {
    const RegionScan& scan = scans[r];
    if (!scan.valid) continue;
    if (scan.cut_at && (regions_[r].state == RegionManager::State::kSealed || !scan.io.ok()))
      cuts.push_back({r, scan.epoch, scan.cut_at, region_bytes_});
    for (const UnreadableSpan& u : scan.unreadable) cuts.push_back({r, scan.epoch, u.at, u.end});
  }
  for (uint32_t p = 0; p < num_regions_; p++) {
    uint32_t nx = succ[p];
    if (nx == kNoRegion || regions_[p].state != RegionManager::State::kSealed ||
        regions_[nx].state != RegionManager::State::kSealed)
      continue;
    regions_[p].next = nx;
    regions_[p].next_epoch = scans[nx].epoch;
  }
  index_.for_each([this](uint64_t hash, const IndexEntry& e) {
    uint64_t fp = object_footprint(e.payload_bytes);
    for_each_part_locked(e.region, uint64_t(e.block) * kBlockSize, fp, [&](uint32_t r, uint64_t len, uint64_t) {
      regions_[r].live_bytes += len;
      regions_[r].hashes.push_back(hash);
    });
    used_bytes_ += fp;
    payload_bytes_ += e.payload_bytes;
  });
  for (uint32_t r = 0; r < num_regions_; r++) regions_[r].hashes.shrink_to_fit();

  // The records behind a region header not walked: their seqs unseen as
  // well. Zeroing the header (a free region) hides them from every walk, as
  // a pad does. Where a pad or a zeroing did not reach the card, the blocks
  // behind it are read and the headers of this card there zeroed one by one
  // (hide_behind): a key deleted while its region was unseen (nothing
  // written) stays deleted, and the next seq is set past the highest found,
  // not by a margin at every such open (2^32 each: the 46 bits spent after
  // 2^14 of them). Only where a block there cannot be read is the next seq
  // set past the highest seen by the margin, so stores from now on outrank
  // what it may hold.
  std::vector<Cut> left;
  if (!read_only_ && !pad_cuts(cuts, unseen, &left)) {
    uint64_t highest = 0;
    const Behind behind = hide_behind(left, &highest);
    if (behind != Behind::kUnknown) next_seq_ = std::max(next_seq_, highest + 1);
    if (behind == Behind::kHidden) {
      ADP_WARN(
          "card %s: %zu crash's cuts, unreadable blocks or region headers not walked could not be padded or "
          "zeroed; the object headers behind them were zeroed instead",
          path().c_str(), left.size());
    } else if (behind == Behind::kBounded) {
      ADP_WARN(
          "card %s: %zu crash's cuts, unreadable blocks or region headers not walked could not be padded or "
          "zeroed, nor every object header behind them; those may be found again by a later open (stores from "
          "now on outrank them: the next seq is set past the highest there, %" PRIu64 ")",
          path().c_str(), left.size(), highest);
    } else {
      recovery_seq_margin_ = unseen_seq_margin();
      next_seq_ += recovery_seq_margin_;
      ADP_WARN(
          "card %s: a crash's cut, an unreadable block or a region header not walked could not be padded or "
          "zeroed, and a block behind it could not be read; the records behind it may be found again by a later "
          "open (stores from now on outrank them: the next seq is set %" PRIu64 " past the highest seen; %" PRIu64
          " store sequence numbers of 2^46 are left)",
          path().c_str(), recovery_seq_margin_, seqs_left());
    }
  }
  if (seqs_left() < kSeqsLeftWarned)
    ADP_WARN("card %s: %" PRIu64
             " store sequence numbers are left of 2^46 (stat store_seqs_left); once they are spent every store is "
             "refused (NoSpace) until the card is reformatted (docs/card_format.md, Recovery, \"A region header not "
             "walked\")",
             path().c_str(), seqs_left());
  if (!stale.empty() && read_only_) {
    // The index holds the newest copies only; a read-write open marks these.
    ADP_INFO("card %s is open read-only: %zu older copies are left as they are (not marked deleted)", path().c_str(),
             stale.size());
  } else if (!stale.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_pending_room_locked(stale.size());  // every one that fails stays pending, never dropped (session 27)
    }
    for (size_t i = 0; i < stale.size(); i++) {
      // The winner's regions, every one a live copy continues into included (a tombstone: its header's).
      const Winner& w = outranking[i];
      stale[i].guards = w.deleted ? std::vector<uint32_t>{w.region}
                                  : parts_of_locked(w.region, uint64_t(w.block) * kBlockSize, w.payload_bytes);
      regions_.pin(stale[i].loc.region);
      pin_guards_locked(stale[i].loc.region, stale[i].guards);
    }
    IoContext ctx;
    if (!write_tombstones(ctx, stale, stale.size()))
      ADP_WARN("card %s: %zu older copies could not be marked deleted yet; their newer copies are kept until they are",
               path().c_str(), pending_.size());
  }
  // The scans and the merge's map were freed: give that memory back to the
  // system, or the process keeps it (about 50 bytes per object recovered).
  scans = {};
  malloc_trim(0);
  recovered_objects_ = index_.size();
  recovery_seconds_ = seconds_since(t0);
  ADP_INFO("opened card %s: recovered %zu objects (%s of %s used, %u regions of %.2f MiB) in %.3f s", path().c_str(),
           index_.size(), log_amount(used_bytes_).c_str(), log_amount(uint64_t(num_regions_) * region_bytes_).c_str(),
           num_regions_, region_bytes_ / double(1u << 20), recovery_seconds_);
  return Status::Ok();
}

uint64_t CardStore::unseen_seq_margin() const {
  return std::max(kUnseenSeqMargin, uint64_t(num_regions_) * (region_bytes_ / kBlockSize));
}

bool CardStore::pad_cuts(const std::vector<Cut>& cuts, const std::vector<uint32_t>& unseen, std::vector<Cut>* left) {
  if (cuts.empty() && unseen.empty()) return true;
  std::vector<Cut> all_spans = cuts;
  for (uint32_t r : unseen) all_spans.push_back({r, 0, kBlockSize, region_bytes_});
  AlignedBuffer block;
  if (!block.reserve(kBlockSize)) {
    if (left) *left = std::move(all_spans);
    return false;
  }
  bool all = true, any = false;
  const uint64_t mark = device_->write_mark();
  auto write = [&](uint64_t offset, const Cut& span) {
    Status s = device_->write(offset, block.data(), kBlockSize);
    if (!s.ok()) count_failure(s);
    if (!s.ok() && left) left->push_back(span);
    all &= s.ok();
    any |= s.ok();
  };
  for (const Cut& c : cuts) {
    encode_pad(block.data(), card_id_, c.epoch, c.end - c.at - kBlockSize, false);
    write(region_offset(c.region) + c.at, c);
  }
  std::memset(block.data(), 0, kBlockSize);
  for (size_t i = cuts.size(); i < all_spans.size(); i++) write(region_offset(all_spans[i].region), all_spans[i]);
  if (any && durable_) {
    Status s = device_->sync(mark);
    if (!s.ok()) count_failure(s);
    if (!s.ok() && left) *left = std::move(all_spans);  // none of them known to be on the card
    all &= s.ok();
  }
  return all;
}

CardStore::Behind CardStore::hide_behind(const std::vector<Cut>& left, uint64_t* highest) {
  *highest = 0;
  constexpr uint64_t kChunk = 256 << 10;
  AlignedBuffer chunk, zeros;
  if (!chunk.reserve(kChunk) || !zeros.reserve(kBlockSize)) return Behind::kUnknown;
  std::memset(zeros.data(), 0, kBlockSize);
  bool unknown = false, all_zeroed = true, any_zeroed = false;
  const uint64_t mark = device_->write_mark();
  // One block of the span: an object header of this card (any epoch) is zeroed; one that checks out (and whose seq
  // a walk would take: check_walked_header) bounds the next seq, zeroed or not.
  auto look = [&](const uint8_t* b, uint64_t offset) {
    ObjectHeader h;
    std::memcpy(&h, b, sizeof h);
    if (std::memcmp(h.magic, kObjectMagic, 8) != 0 || h.card_id != card_id_) return;
    const bool valid = decode_object_header(b, card_id_, h.epoch, &h);
    if (valid && h.seq <= kMaxIndexSeq) *highest = std::max(*highest, h.seq);
    Status s = device_->write(offset, zeros.data(), kBlockSize);
    if (!s.ok()) count_failure(s);
    any_zeroed |= s.ok();
    all_zeroed &= s.ok();
    unknown |= !s.ok() && !valid;  // bytes that read back wrong now may read as another seq later
  };
  for (const Cut& c : left) {
    const uint64_t base = region_offset(c.region);
    for (uint64_t off = c.at; off < c.end;) {
      const uint64_t len = std::min(kChunk, c.end - off);
      Status s = device_->read(base + off, chunk.data(), len);
      if (s.ok()) {
        for (uint64_t i = 0; i < len; i += kBlockSize) look(chunk.data() + i, base + off + i);
      } else {  // somewhere in the chunk: its blocks one by one
        for (uint64_t i = 0; i < len; i += kBlockSize) {
          Status bs = device_->read(base + off + i, chunk.data(), kBlockSize);
          if (bs.ok()) {
            look(chunk.data(), base + off + i);
          } else {
            count_failure(bs);
            unknown = true;
          }
        }
      }
      off += len;
    }
  }
  if (any_zeroed && durable_) {
    Status s = device_->sync(mark);
    if (!s.ok()) count_failure(s);
    all_zeroed &= s.ok();
  }
  if (unknown) return Behind::kUnknown;
  return all_zeroed ? Behind::kHidden : Behind::kBounded;
}

}  // namespace adp
