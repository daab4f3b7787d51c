// SPDX-License-Identifier: Apache-2.0
// The reservation of a store's place: the write frontier (advance_frontier,
// reserve), the eviction of a region and what it drops from the index,
// the settling of tickets (settle_locked, resolve, abandon), the pins
// (unpin), and the I/O of a record's extents (io_mapped), which loads use
// too. Not here: writing the record (card_store_put.cc), reading it
// (card_store_get.cc).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <mutex>
#include <thread>

#include "store/card_store.h"
#include "store/card_store_internal.h"
#include "util/log.h"

namespace adp {

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
      evicting_.emplace_back(h, it->second);  // room made by the caller: one a key list entry at most
      erase_entry_locked(h, it->second);
      evicted++;
    }
  }
  if (evicted) {
    counters_.evicted_objects += evicted;
    counters_.evicted_regions++;
    if (!evicting_logged_) {
      evicting_logged_ = true;
      ADP_INFO("card %s is full: evicting least recently used regions", path().c_str());
    }
  }
}

void CardStore::fail_eviction_locked(uint32_t r, RegionManager::Region&& saved, size_t held) {
  const uint32_t pins = regions_[r].pins;  // taken and given back meanwhile, by whom pinned it
  regions_[r] = std::move(saved);
  regions_[r].pins = pins;
  regions_[r].live_bytes = 0;  // none of its objects is indexed again
  regions_[r].hashes.clear();
  regions_[r].hashes.shrink_to_fit();
  for (const auto& [h, e] : evicting_) {
    // Not indexed again: where the failed write tore the old header, or a failed sync lost nothing and the new
    // one landed, the object does not walk at the next open, and one that exists() had answered for would be a
    // held object lost (card_crash_test's torn and failed-sync points, with the first form of this fix). Marked
    // deleted instead (its tombstone retried as any failed one), so that it does not come back where the old
    // header is still there.
    std::vector<uint32_t> guards;
    if (auto cur = index_.find(h); cur) {
      // Stored anew while r's header was written (a store reserved before the eviction): that commit found no
      // older copy to mark deleted. This copy is a superseded one: guarded by the newer copy's regions.
      try {
        guards =
            parts_of_locked(cur->second.region, uint64_t(cur->second.block) * kBlockSize, cur->second.payload_bytes);
      } catch (const std::bad_alloc&) {
        guards.clear();  // unguarded: as a tombstone of session 23's (its newer copy's eviction may undo it)
      }
      pin_guards_locked(e.region, guards);
    }
    push_pending_locked(
        {{e.region, uint64_t(e.block) * kBlockSize, regions_[e.region].epoch, e.seq, e.payload_bytes, h, {}},
         std::move(guards),
         {}});  // into the room the caller held: no allocation
  }
  evicting_.clear();
  end_evicting_locked();
  pending_room_ -= held;
  pending_count_ = pending_.size();
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
                                   Clock::time_point deadline, const OwnPins& own, uint32_t* region) {
  // Regions whose header write failed in this call, retired for now (not taken again by it); retired for good if
  // another region opens, else put back as they were: a card whose every write fails (gone, read-only, full) keeps
  // its regions. Before session 33 a failed region went back to the free list, handed out again by the next
  // store on a full card (the only free region): one bad header block failed every store (review33a F5).
  uint32_t failed[kOpenTries];
  // Whether failed[i]'s header write itself was refused (a bad block: retired); else its sync failed or there was no
  // memory, which says nothing about its block (review33d): put back as when no region opens.
  bool refused[kOpenTries] = {};
  // Each one's own failure (its WARNING says it: before session 34 every retired region's line gave the last
  // try's message, review33d F4). Moved in: no allocation.
  Status failures[kOpenTries];
  int nfailed = 0;
  Status s;
  // After a free region's header write failed, only other free regions are tried: a sparse image's filesystem
  // full (ENOSPC) fails the write of a block never written, and an eviction (its region's blocks written before)
  // would then succeed and retire the free regions for a full filesystem, not a bad block.
  bool may_evict = true;
  bool waited = false;
  while (nfailed < kOpenTries) {
    uint32_t r = 0;
    bool found = false, evicted = false;
    for (;;) {
      if ((found = regions_.take_free(&r))) break;
      int64_t victim = may_evict ? regions_.choose_victim() : -1;
      if (victim >= 0) {
        r = static_cast<uint32_t>(victim);
        found = evicted = true;
        break;
      }
      if (nfailed) break;  // no other region now: the header write's failure is the answer
      // Only a pin that someone else lets go of can free a region: where every region passed over is one this
      // store's own put holds (its earlier objects', kept until its commit, which waits for this store), a wait is
      // futile. Until session 35 a put larger than the card waited its 5 s here for them (region_wait_test).
      if (!regions_.others_may_unpin(own.earlier, own.current))
        return Status::NoSpace("card " + path() + " is full and every region is held by this put's own objects");
      // A store whose deadline has passed waits for nothing and is not counted in region_waits, which counts the
      // stores that waited: a later item of a put whose earlier item's wait ran out (put_each; its deadline is its
      // start; the put's wait that ran out was counted, once), or one whose 5 s ran out while it queued for
      // frontier_mu_. Its refusal is in store_failures, as any other. Until session 36 each was counted, then failed
      // without waiting (region_wait_test: a put past the card beside a held load, 12 region waits for its one).
      if (Clock::now() < deadline) {
        if (!waited) counters_.region_waits++, waited = true;
        region_waiters_++;
        const std::cv_status w = unpinned_.wait_until(lock, deadline);
        region_waiters_--;
        if (w == std::cv_status::no_timeout) continue;
      }
      return Status::NoSpace("card " + path() + " is full and every region is being written or read");
    }
    if (!found) break;
    RegionManager::Region saved;  // the region as it was (its epoch, chain, key list): what a failure puts back
    size_t held = 0;
    if (evicted) {
      // Made before anything changes: room for the entries the eviction drops and for the tombstones its
      // failure hands to pending_ (fail_eviction_locked). A std::bad_alloc leaves the region as it was.
      try {
        evicting_.reserve(regions_[r].hashes.size());
        hold_pending_room_locked(regions_[r].hashes.size());
        held = regions_[r].hashes.size();
      } catch (const std::bad_alloc&) {
        s = no_memory();
        break;
      }
      evict_locked(r);
    }
    // A free region may hold the old records of an eviction that failed (below), their tombstones pending under
    // its old epoch: kept by retry_pending until this header is durable, as an evicted region's. One that
    // retry_pending took out before (being written now, the region pinned) is waited for: take_free hands out no
    // pinned region (session 34).
    evicting_region_ = r;
    saved = std::move(regions_[r]);
    regions_[r].pins = saved.pins;
    regions_[r].hashes.clear();
    uint64_t epoch = regions_.open(r, kBlockSize);
    uint32_t prev = frontier_ >= 0 ? static_cast<uint32_t>(frontier_) : kNoRegion;
    uint64_t prev_epoch = frontier_ >= 0 ? regions_[prev].epoch : 0;
    lock.unlock();
    encode_region_header(ctx.header_.data(), card_id_, epoch, r, prev, prev_epoch, cont_bytes);
    const uint64_t mark = device_->write_mark();
    bool write_refused = false;
    try {
      s = device_->write(region_offset(r), ctx.header_.data(), kBlockSize);
      write_refused = !s.ok();
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
      // An evicted region's old header and records may still be on the card (the new header is not, or not
      // durably): its objects would walk again at the next open. Each is marked deleted (review33a F1).
      if (evicted) {
        fail_eviction_locked(r, std::move(saved), held);
      } else {
        const uint32_t pins = regions_[r].pins;
        regions_[r] = std::move(saved);  // free, off the free list while retired, under its old epoch
        regions_[r].pins = pins;
        end_evicting_locked();
        may_evict = false;
      }
      regions_[r].retired = true;  // not taken again by this call
      refused[nfailed] = write_refused;
      failures[nfailed] = std::move(s);
      failed[nfailed++] = r;
      continue;
    }
    // r is reused: a pending tombstone of a copy in it has nothing left to mark deleted, and the next retry_pending
    // drops it and lets go of its guards, backed off or not. Until review34b it looked only when some tombstone was
    // due: a backed-off one kept its newer copy's regions pinned for up to kPendingBackoffCalls stores and deletes
    // after its region's reuse (tombstone_backoff_test: 24 of 61 objects' room held).
    end_evicting_locked();
    if (evicted) {
      evicting_.clear();
      pending_room_ -= held;
    }
    for (int i = 0; i < nfailed; i++) {
      if (!refused[i]) {
        regions_[failed[i]].retired = false;
        regions_.add_free_last(failed[i]);
        continue;
      }
      retired_regions_++;
      ADP_WARN(
          "card %s: region %u's header block refused a write; the region is retired until the card is "
          "reopened (%s)",
          path().c_str(), failed[i], failures[i].message().c_str());
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
  // No region opened (every write fails: a card gone, read-only, its filesystem full): none is taken for a bad
  // block. Each goes to the free list, after every other free region, under its old epoch (an evicted one's
  // objects already out of the index, their tombstones pending): the next store takes it again, and evicts
  // nothing more while the card fails, as before session 33.
  for (int i = 0; i < nfailed; i++) {
    regions_[failed[i]].retired = false;
    regions_.add_free_last(failed[i]);
  }
  return nfailed ? failures[nfailed - 1] : s;
}

Status CardStore::reserve(IoContext& ctx, uint64_t hash, uint64_t payload_bytes, Placement* pl, bool may_wait,
                          std::span<const uint32_t> own, bool shared) {
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
  // Taken before frontier_mu_: a store that finds no region free or evictable waits for one (unpinned_) up to
  // 5 s from here, however long it queued behind another reservation. frontier_mu_ stays held across that wait (a
  // continuation must be the next region after the one it continues, opened by the same reservation); every store
  // queued behind it needs a region too (the frontier is full whenever one is opened), and loads and deletes never
  // take frontier_mu_. Until session 34 each reservation's 5 s started when it took frontier_mu_ (and each
  // continuation's anew): k stores queued behind one that waited in vain failed after 5, 10, .. 5k s, each holding
  // its caller's thread (region_wait_test).
  const auto deadline = Clock::now() + (may_wait ? std::chrono::seconds(5) : std::chrono::seconds(0));
  std::unique_lock<std::mutex> flock(frontier_mu_, std::defer_lock);
  if (!shared) {
    flock.lock();
  } else {
    // The second put of a shared sync holds the first put's objects uncommitted, their regions pinned, until it
    // returns: a store ahead of it on frontier_mu_ that waits for a region may wait for those, and would fail
    // after its 5 s with this put stuck behind it (region_waiters_). This one fails instead, at once. Polled: the
    // holder of frontier_mu_ may begin such a wait at any time, and a reservation holds it for microseconds, the
    // opening of a region for a header write and its sync.
    while (!flock.try_lock()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (region_waiters_ > 0)
          return Status::NoSpace("card " + path() +
                                 " is full: a store waits for a region, and this one (sharing an earlier store's "
                                 "sync, whose regions it holds) waits for none");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  // An index entry holds a seq in 46 bits: past it a store would be indexed
  // under its seq cut short, its load would miss (the card's seq differs) and
  // the older copy it supersedes be marked deleted. Refused instead.
  if (next_seq_ > kMaxIndexSeq)
    return Status::NoSpace("card " + path() + ": its store sequence numbers are spent (over 2^46); reformat it");
  uint32_t f;
  // A failed sync that returned after a write issued from the frontier
  // region's open_mark on may have lost it for good (its header, a record, a
  // pad: a hole that recovery's walk stops at; util/group_sync.h), and its
  // stores are failed for it (their sync is given its open_mark): the
  // frontier moves on, as past a pad that could not be written.
  if (frontier_ >= 0 && device_->lost_after(regions_[frontier_].open_mark))
    regions_[frontier_].write_offset = region_bytes_;
  if (frontier_ < 0 || regions_[frontier_].write_offset >= region_bytes_) {
    Status s = advance_frontier(ctx, lock, 0, deadline, {own, {}}, &f);
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
      s = advance_frontier(ctx, lock, take, deadline, {own, pl->regions}, &r);
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

void CardStore::unpin(uint32_t r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (regions_.unpin(r)) unpinned_.notify_all();
}

}  // namespace adp
