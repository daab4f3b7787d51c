// SPDX-License-Identifier: Apache-2.0
// remove: when a delete is refused (a store of the key unsettled), the
// check of the object's header against the key, and the delete's
// tombstone. Not here: the tombstone's write itself (write_tombstone,
// card_store_put.cc).
#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "store/card_store.h"
#include "store/card_store_internal.h"
#include "store/index_hash.h"
#include "util/log.h"
#include "util/scope_exit.h"

namespace adp {

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
  // Evicted, its region's new header not yet durable: the old header and record walk again at the next open if
  // that header never lands (a crash, a failed write), and a NotFound here would be a delete undone (review33a
  // F1). Refused until the header is durable (then NotFound) or has failed (then its old record is marked deleted).
  for (const auto& [h, e] : evicting_)
    if (h == hash)
      return Status::Busy("this key's region is being evicted on card " + path() + "; the delete is not done");
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
  const uint64_t h = index_hash(key);
  // Its key's pending tombstones whatever their back-off: this delete is refused while one is pending.
  retry_pending(ctx, &h);
  Location loc;
  loc.key.assign(key);  // made before anything changes (session 26)
  IndexEntry e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = remove_refusal_locked(h);
    if (!s.ok()) return s;
    auto it = index_.find(h);
    if (it == index_.end()) {
      // A copy of the key whose tombstone is pending (its write failed, here in retry_pending too): one an eviction
      // whose header write failed left on the card walks again at the next open, so a NotFound with nothing
      // written would be a delete undone (review33a F1). Refused until it is written.
      for (const Stale& p : pending_)
        if (p.loc.hash == h && p.loc.seq)
          return Status::IoError("a copy of this key is not yet marked deleted on card " + path() +
                                 "; the delete is not done");
      return Status::NotFound();
    }
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

}  // namespace adp
