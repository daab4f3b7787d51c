// SPDX-License-Identifier: Apache-2.0
// The put path: put and put_each (reserve, write, sync, index), the write
// shapes (write_in_pieces, write_filled, write_body_then_header), and the
// tombstones that mark an older copy deleted (write_tombstone,
// write_tombstones, the pending ones' retry). Not here: the reservation of
// the place and the frontier (card_store_reserve.cc), remove
// (card_store_remove.cc).
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <optional>

#include "store/card_store.h"
#include "store/card_store_internal.h"
#include "store/index_hash.h"
#include "util/crc32c.h"
#include "util/log.h"
#include "util/scope_exit.h"

namespace adp {
namespace {

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

// On a disk card (no mapping, not memory-backed: CardStore::put_each), a store of one I/O (the header block with the
// payload: an aligned object below kOverlapCrcBytes, a staged or filled one of at most this footprint) is copied (or
// filled) and checksummed before its reservation, into the staging buffer the previous store's write, in flight,
// does not use: that copy and CRC run while the previous write is on the card, on the same thread. The bound is the
// second staging buffer's (the same as write_filled's whole-object staging): a larger object is written as before.
constexpr size_t kAheadBytes = kGuardedPieceBytes;

// Fills [dst, dst + len) from it.fill (the object's bytes from `offset`) in pieces of kFillPieceBytes, each
// checksummed where it landed (*crc extended) while it is in the CPU's cache. `dev` (a mapped fill): each piece
// told to it as written to its mapping `map`, even failing. A failed piece's status: the source failed.
Status fill_checked(const PutItem& it, uint8_t* dst, uint64_t offset, size_t len, uint32_t* crc,
                    const Device* dev = nullptr, const uint8_t* map = nullptr) {
  for (size_t done = 0; done < len;) {
    size_t l = std::min(len - done, kFillPieceBytes);
    Status s = it.fill(dst + done, offset + done, l);
    if (dev) dev->mapped_written(static_cast<uint64_t>(dst + done - map), l);  // what it wrote, even failing
    if (!s.ok()) return s;
    *crc = crc32c_extend(*crc, dst + done, l);
    done += l;
  }
  return Status::Ok();
}

// Room for one more element in v, grown geometrically (reserve(size + 1) would copy it on every push).
template <typename T>
void room_for_one(std::vector<T>& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(8, v.capacity() * 2));
}

}  // namespace

void CardStore::put(IoContext& ctx, const PutItem* items, size_t n, Status* results,
                    const std::function<bool()>& still_wanted) {
  std::optional<bool> asked;  // one caller: asked once
  put_each(ctx, items, n, results, [&](size_t) {
    if (!asked) asked = still_wanted();
    return *asked;
  });
}

void CardStore::put_each(IoContext& ctx, const PutItem* items, size_t n, Status* results,
                         const std::function<bool(size_t item)>& item_wanted, SyncShare* share) {
  const StoreCall call;
  const Foreground busy = device_->begin_foreground();
  ctx.store_ = this;
  if (read_only_) {
    for (size_t i = 0; i < n; i++) results[i] = read_only_refusal("store");
    return;
  }
  if (!ctx.header_.reserve(2 * kBlockSize) || !ctx.tails_.reserve(4 * kBlockSize)) {
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
  // A put that shares an earlier put's sync (SyncShare) starts with that put's pins (its first `borrowed`): its
  // reservations treat them as its own (never waited for), and it never unpins them (the earlier put does, at its
  // commit).
  std::vector<uint32_t> pinned;
  if (share) pinned.assign(share->pins.begin(), share->pins.end());
  const size_t borrowed = pinned.size();
  // The second put of a shared sync (the first's mark given): it queues behind no store that waits for a region.
  const bool second_put = share && share->since != UINT64_MAX;
  // The written item's store was acknowledged (kIndexed) or failed (1) (settle_locked).
  constexpr uint8_t kIndexed = 2;
  std::vector<uint8_t> settled(n, 0);
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
  // Each item's result is left true (debt37, review36): one indexed before the exception stays Ok (it is on the card
  // and visible), one written and not indexed (voided here or by the commit as unwanted) fails as out of memory,
  // counted; the others already hold their failure.
  ScopeExit undo([&] {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; i++) {
      if (written[i].region != UINT32_MAX && !settled[i]) {
        settle_locked(tickets[i], false);
        Location& loc = written[i];  // its key (maybe not copied) is the one its header holds: write_tombstone
        loc.seq = 0;
        push_pending_locked({std::move(loc), {}, {}});  // room held: no allocation
      }
      if (written[i].region != UINT32_MAX && settled[i] != kIndexed && results[i].ok()) {
        results[i] = no_memory();  // allocates nothing
        counters_.store_failures++;
        counters_.memory_failures++;
      }
    }
    if (!unpinned)
      for (size_t k = borrowed; k < pinned.size(); k++)
        if (regions_.unpin(pinned[k])) unpinned_.notify_all();
    if (!stale_handed) pend_stale_locked(stale);
    pending_room_ -= held;
    pending_count_ = pending_.size();
  });
  uint64_t last_ticket = 0;
  bool any_written = false;
  // The oldest open_mark of the regions this put's records start in: its sync fails where a failed sync since may
  // have lost one of its writes, or one they depend on (a record or pad in front of one of them).
  // A put that shares an earlier put's sync (SyncShare) starts from that put's mark.
  uint64_t since = share ? share->since : UINT64_MAX;
  Placement pl;
  // False once an item's wait for a region ran out (NoSpace: every region pinned for 5 s): the later items look for
  // a region free or evictable, and wait for none. A put's earlier items keep their regions pinned until its commit,
  // so a put larger than the card's unpinned room waited 5 s for each item past it (n items, 5n s, its caller's
  // thread held; until review34b), for pins that were mostly its own (region_wait_test). Its own pins (`pinned`)
  // are never waited for (advance_frontier): an item that finds every region held by them fails at once.
  bool may_wait = true;
  // Item i's write done (or failed): its place abandoned and its ticket resolved as failed, or resolved and
  // recorded as written (indexed at the commit, after the sync).
  auto settle_write = [&](size_t i, const Placement& p, Status s, bool card_error) {
    const PutItem& it = items[i];
    if (!s.ok()) {
      if (card_error) count_failure(s);
      abandon(ctx, p, it.size);
      resolve(p.ticket, true);
      results[i] = std::move(s);
      return;
    }
    resolve(p.ticket, false);
    results[i] = Status::Ok();
    counters_.bytes_written += object_footprint(it.size);
    // Its key copied only for a tombstone (keyed).
    written[i] = {p.region, p.offset, p.epoch, p.seq, it.size, index_hash(it.key)};
    tickets[i] = p.ticket;
    any_written = true;
    since = std::min(since, p.since);
  };
  // Reserves item i's place (pl), its regions pinned until the commit; false (results[i] set) where refused.
  auto place = [&](size_t i, uint64_t hash, uint64_t fp) {
    pinned.reserve(pinned.size() + 2 + fp / (region_bytes_ - kBlockSize));  // the regions it may span
    Status s;
    try {
      s = reserve(ctx, hash, items[i].size, &pl, may_wait, pinned, second_put);  // a std::bad_alloc: none reserved
    } catch (const std::bad_alloc&) {
      s = no_memory();
    }
    if (!s.ok()) {
      if (s.code() == Status::Code::kNoSpace) may_wait = false;
      results[i] = std::move(s);
      return false;
    }
    pinned.insert(pinned.end(), pl.regions.begin(), pl.regions.end());  // room made above: no allocation
    last_ticket = pl.ticket;
    return true;
  };
  // A disk card's stores of one I/O overlap (kAheadBytes): the write of one item is in flight (ctx's writer) while
  // the next is copied (or filled) and checksummed into the other staging buffer; then the first is waited for and
  // settled, and the next reserved and submitted. No device I/O of this thread while a write is in flight: the
  // reservation (which may open a region: a header write and its sync; or wait for a region another put holds,
  // itself waiting for this put's ticket), abandon and the commit's sync all come after the wait.
  DeviceWriter* writer = device_->mapped() || device_->memory_backed() ? nullptr : writer_of(ctx);
  Placement flight_pl;  // the item in flight's placement (swapped with pl: no allocation)
  size_t flight_item = 0;
  int flight_buf = 0;  // its staging buffer: 0, ctx.staging_ (ctx.tails_'s first two blocks); 1, ctx.staging2_
  bool in_flight = false;
  auto land = [&] {
    if (!in_flight) return;
    in_flight = false;
    Status s;
    try {
      s = writer->wait();
    } catch (const std::bad_alloc&) {  // its result's message: the write is complete, its fate unknown
      s = no_memory();
    }
    settle_write(flight_item, flight_pl, std::move(s), true);
  };
  // An exception while a write is in flight (a fill's own, std::bad_alloc) waits for it first (it reads the
  // caller's memory and ctx's), and settles it: then undo (declared before: it runs after) voids it if written.
  ScopeExit landed([&] { land(); });
  for (size_t i = 0; i < n; i++) {
    const PutItem& it = items[i];
    results[i] = check_key(it.key);
    if (!results[i].ok()) continue;
    // Failed until its write is done (settle_write): a std::bad_alloc out of put_each before that (its reservation's
    // room among the pins, an oversize refusal's text) leaves it reported failed, not Ok unstored (review37b: the
    // key check's Ok stood, and EmbeddedSession::put_group handed it out). Allocates nothing.
    results[i] = no_memory();
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
    const bool staged = filled || !aligned;
    if (writer && (staged ? fp <= kAheadBytes : it.size < kOverlapCrcBytes)) {
      const int b = in_flight ? 1 - flight_buf : 0;
      AlignedBuffer& buf = b ? ctx.staging2_ : ctx.staging_;
      if (staged && !buf.reserve(fp)) {
        results[i] = Status::IoError("out of memory for staging", Status::IoClass::kGatewayMemory);
        continue;
      }
      // The header block, then the payload (staged), or the tail block (zero-copy).
      uint8_t* st = staged ? buf.data() : ctx.tails_.data() + b * 2 * kBlockSize;
      const size_t body = it.size & ~(kBlockSize - 1), tail = it.size - body;
      uint32_t pcrc = 0;
      if (filled) {
        Status fs;
        try {  // another exception (the fill's own) goes up: nothing of this item reserved or written
          fs = fill_checked(it, st + kBlockSize, 0, it.size, &pcrc);
        } catch (const std::bad_alloc&) {
          results[i] = no_memory();
          continue;
        }
        if (!fs.ok()) {  // its source failed (the caller answers for it): no place taken
          source_failed[i] = 1;
          results[i] = std::move(fs);
          continue;
        }
      } else if (!aligned) {
        pcrc = crc32c_copy(st + kBlockSize, it.data, it.size);  // stage and checksum in one pass
      } else {
        pcrc = crc32c(it.data, it.size);
        if (tail) {
          std::memcpy(st + kBlockSize, it.data + body, tail);
          std::memset(st + kBlockSize + tail, 0, kBlockSize - tail);
        }
      }
      if (staged) std::memset(st + kBlockSize + it.size, 0, fp - kBlockSize - it.size);
      // Counted only where the write before is in flight: not one made synchronously (a failed io_submit: review37b).
      if (in_flight && writer->in_flight()) counters_.writes_overlapped++;
      land();
      if (!place(i, hash, fp)) continue;
      Status s;
      const uint32_t flags = continues(pl.offset, it.size) ? uint32_t(kObjectContinues) : 0u;
      encode_object_header(st, card_id_, pl.epoch, pl.seq, it.key, it.size, pcrc, flags);
      iovec iov[3] = {{st, staged ? fp : kBlockSize}};
      int iovcnt = 1;
      if (!staged) {
        iov[iovcnt++] = {const_cast<uint8_t*>(it.data), body};
        if (tail) iov[iovcnt++] = {st + kBlockSize, kBlockSize};
      }
      if (pl.ext.size() == 1) {  // one request: in flight while the next item is prepared
        try {
          writer->submit(pl.ext[0].at, iov, iovcnt);
        } catch (const std::bad_alloc&) {
          settle_write(i, pl, no_memory(), false);
          continue;
        }
        in_flight = true, flight_item = i, flight_buf = b;
        std::swap(pl, flight_pl);
        continue;
      }
      bool card_error = true;  // a record over several regions: its requests in order (io_mapped), now
      try {
        s = io_mapped(true, pl.ext, 0, iov, iovcnt);
      } catch (const std::bad_alloc&) {
        s = no_memory();
        card_error = false;
      }
      settle_write(i, pl, std::move(s), card_error);
      continue;
    }
    land();
    if (!filled && !aligned && !ctx.staging_.reserve(fp)) {
      results[i] = Status::IoError("out of memory for staging", Status::IoClass::kGatewayMemory);
      continue;
    }
    if (!place(i, hash, fp)) continue;
    Status s;
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
    settle_write(i, pl, std::move(s), card_error);
  }
  land();
  if (any_written) {
    // Every store reserved before this put's last one must be on the card
    // (or marked abandoned) first: recovery walks a region up to its first
    // hole, so a store behind a hole is not acknowledged.
    std::unique_lock<std::mutex> lock(mu_);
    resolved_.wait(lock, [&] { return unresolved_.empty() || *unresolved_.begin() > last_ticket; });
  }
  bool synced = true;
  // The later put that shares this one's sync (SyncShare) is written first; its sync (counted there) is this one's.
  std::optional<Status> shared;
  if (any_written && durable_ && share && share->before_sync) shared = share->before_sync(since, pinned);
  const bool syncs = (any_written || (share && share->since != UINT64_MAX)) && durable_;
  // The writes are done (the later put that shares this one's sync called it before its own): the worker's other
  // thread may write while this sync runs (SyncShare::written).
  if (syncs && !shared && share && share->written && *share->written) (*share->written)();
  if (syncs) {
    Status s = shared ? *shared : device_->sync(since);
    if (share) share->result = s;
    if (!s.ok()) {
      if (!shared) count_failure(s);
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
      settle_locked(tickets[i], true), settled[i] = kIndexed;
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
          pin_guards_locked(loc.region, guards);
          stale.push_back({std::move(loc), std::move(guards), {}});
          continue;
        }
        regions_.pin(old.region);
        pin_guards_locked(old.region, guards);
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
    for (size_t k = borrowed; k < pinned.size(); k++)
      if (regions_.unpin(pinned[k])) unpinned_.notify_all();
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

void CardStore::pin_guards_locked(uint32_t older, std::vector<uint32_t>& guards) {
  guards.erase(std::remove(guards.begin(), guards.end(), older), guards.end());
  for (uint32_t r : guards) regions_.pin(r);
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
    push_pending_locked(std::move(st));  // room held by the caller: no allocation; its guards stay pinned
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
    // Backed off: skipped by the next 2^(failures-1) - 1 retries, so that a block that keeps refusing writes is
    // not written at every store and delete (an I/O error each, on their path; before session 34 it was).
    st.failures++;
    st.due = pending_calls_.load() +
             std::min<uint64_t>(uint64_t(1) << std::min<uint32_t>(st.failures - 1, 20), kPendingBackoffCalls);
    push_pending_locked(std::move(st));
  }
  pending_room_ -= held;
  pending_count_ = pending_.size();
  return all;
}

void CardStore::retry_pending(IoContext& ctx, const uint64_t* hash) {
  if (pending_count_.load() == 0) return;
  const uint64_t call = ++pending_calls_;
  if (!hash && call < pending_due_.load()) return;  // none due: no lock taken, nothing allocated
  std::vector<Stale> retry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_scans_++;
    // Its region is being evicted, the new header not yet durable: if that write fails the region is put back
    // under its old epoch, this copy with it (fail_eviction_locked). Kept, guards and all, until then (before
    // session 33 it was dropped as reused: review33a, retry_pending, and the superseded copy came back), and not due
    // meanwhile: the eviction's end makes the next call look (end_evicting_locked). Until session 36 such a
    // tombstone counted as due and lowered pending_due_ to the call, so that while the header was in flight every
    // store took mu_, scanned pending_ and allocated its retry list for nothing (review34b).
    auto held = [&](const Stale& p) { return evicting_region_ == static_cast<int64_t>(p.loc.region); };
    // Due: its back-off over, its key's delete, or its region reused (nothing left to delete: dropped at no cost,
    // its guards unpinned).
    auto due = [&](const Stale& p) {
      return !held(p) &&
             (p.due <= call || (hash && p.loc.hash == *hash) || regions_[p.loc.region].epoch != p.loc.epoch);
    };
    size_t n = 0;
    uint64_t next = UINT64_MAX;
    for (const Stale& p : pending_) {
      n += due(p);
      if (!held(p)) next = std::min(next, p.due);
    }
    if (!n) {
      pending_due_ = next;
      return;
    }
    try {
      retry.reserve(n);
    } catch (const std::bad_alloc&) {
      return;  // a retry is optional: the next store or delete tries again
    }
    size_t kept = 0;  // those that stay pending (backed off; a void whose voiding_ entry could not be made)
    next = UINT64_MAX;
    for (Stale& p : pending_) {
      if (!due(p)) {
        if (!held(p)) next = std::min(next, p.due);
        if (&pending_[kept] != &p) pending_[kept] = std::move(p);
        kept++;
        continue;
      }
      next = std::min(next, call);  // kept below (not retried now): due at the next call
      const RegionManager::Region& reg = regions_[p.loc.region];
      // Free under the same epoch: a region whose eviction's header write failed, its old records on the card.
      if (reg.epoch == p.loc.epoch) {
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
    pending_due_ = next;
    // The slots they leave in pending_ are held for them: one that fails again goes back without allocating.
    pending_room_ += retry.size();
  }
  write_tombstones(ctx, retry, retry.size());
}

DeviceWriter* CardStore::writer_of(IoContext& ctx) {
  if (ctx.writer_ && ctx.writer_store_ == serial_) return ctx.writer_.get();
  ctx.writer_.reset();  // another store's (its AIO context given back first)
  try {
    ctx.writer_ = device_->make_writer();
  } catch (const std::bad_alloc&) {
    return nullptr;  // this put's writes made as without one
  }
  ctx.writer_store_ = serial_;
  return ctx.writer_.get();
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
    Status s = fill_checked(it, dst, offset, len, &pcrc, map ? device_.get() : nullptr, map);
    *source_failed = !s.ok();
    return s;
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

}  // namespace adp
