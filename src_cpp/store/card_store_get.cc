// SPDX-License-Identifier: Apache-2.0
// The read path: a load's lookup and checks (lookup, check_entry_header,
// read_and_check), get (each ReadInto), get_via_bounce (protocol r5 loads),
// exists, and the drop of an object a load found damaged. Not here: the I/O
// of a record's extents (io_mapped, card_store_reserve.cc), verify
// (verify.cc).
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>

#include "store/card_store.h"
#include "store/card_store_internal.h"
#include "store/index_hash.h"
#include "util/crc32c.h"
#include "util/load_profile.h"
#include "util/log.h"
#include "util/scope_exit.h"

namespace adp {
namespace {

// Runs ahead() on this thread while the CRC just started on `crc` runs, and returns that CRC; the CrcWorker is
// waited for on every way out (an exception of ahead() too: it may be reading or writing the caller's buffer).
template <class Ahead>
uint32_t crc_beside(CrcWorker& crc, const Ahead& ahead) {
  bool joined = false;
  ScopeExit join_on_exit([&] {
    if (!joined) crc.wait();
  });
  ahead();
  const uint32_t got = crc.wait();
  joined = true;
  return got;
}

}  // namespace

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
                                      std::string_view key, size_t guard_piece_bytes, uint64_t* deferred_epoch) {
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
  bool mapped = false, direct = false, defer = false;
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
    // Every region the object has bytes in: pinned, and refreshed for LRU (not only the header's: a region
    // holding only the continuation of a hot object would age from its opening and be evicted with it,
    // review33a F2). Under the lock that checked the entry, so no eviction chooses between the two.
    for (uint32_t r : regs) {
      regions_.pin(r);
      regions_.touch(r);
    }
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
    // Deferred (deferred_epoch, get_each's large loads): no CRC here; finish_direct checks the payload while the
    // next key's object is read.
    defer = check_payload && deferred_epoch;
    const bool overlap = guard && check_payload && !defer;
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
      if (check_payload && !defer && io->ok()) {
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
  if (defer && io->ok()) {  // its header, tail and CRC checked by finish_direct
    *deferred_epoch = epoch;
    return std::string();
  }
  const ReadKind kind = mapped ? ReadKind::kMapped : direct ? ReadKind::kDirect : ReadKind::kStaged;
  return judge_read(ctx, hash, e, epoch, key, io, check_payload, payload_dst, guard, kind, body_crc,
                    header_checked ? &header_why : nullptr);
}

std::string CardStore::judge_read(IoContext& ctx, uint64_t hash, const IndexEntry& e, uint64_t epoch,
                                  std::string_view key, Status* io, bool check_payload, uint8_t* payload_dst,
                                  const PieceGuardFn* guard, ReadKind kind, uint32_t body_crc,
                                  const std::string* header_why) {
  const size_t body = e.payload_bytes & ~(kBlockSize - 1), tail = e.payload_bytes - body;
  // Deleted meanwhile, or the caller gave up part way (a failure, not a
  // miss: the buffer may hold the pieces read): no damage either way.
  if (io->is_not_found() || io->code() == Status::Code::kTimedOut) return std::string();
  if (!io->ok()) {
    count_failure(*io);  // the card's, or (no staging) this process's memory
    return io->message();
  }
  counters_.bytes_read += object_footprint(e.payload_bytes);
  const uint8_t* block = ctx.staging_.data();
  std::string why = header_why ? *header_why : check_entry_header(block, hash, e, epoch, key, io);
  if (!why.empty() && overwritten_meanwhile(hash, e)) {
    *io = Status::NotFound("deleted or replaced while it was read");
    return std::string();
  }
  if (!why.empty() || !io->ok()) return why;
  ObjectHeader hdr;
  std::memcpy(&hdr, block, sizeof hdr);
  const bool direct = kind == ReadKind::kDirect;
  if (direct && tail) {
    auto copy_tail = [&] { std::memcpy(payload_dst + body, block + kBlockSize, tail); };
    if (!guard) {
      copy_tail();
    } else if (!(*guard)(e.payload_bytes, copy_tail)) {
      *io = Status::TimedOut("deadline passed while the object was read into the buffer");
      return std::string();
    }
  }
  if (check_payload && (kind == ReadKind::kMapped ? body_crc
                        : direct                  ? crc32c_extend(body_crc, payload_dst + body, tail)
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
      for (uint32_t r : regs) {  // every region of it pinned and refreshed, as in read_and_check
        regions_.pin(r);
        regions_.touch(r);
      }
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
  return get_one(ctx, key, deliver, into, pieces, piece_bytes, nullptr, nullptr);
}

bool CardStore::stage_ahead(IoContext& ctx, std::string_view key, StagedRead* out, const DeliverPayloadFn& deliver,
                            const PieceGuardFn& pieces, size_t piece_bytes, bool inside_pieces) {
  ctx.store_ = this;
  out->lookup = lookup(key, &out->hash, &out->e);
  if (!out->lookup.ok()) return true;  // a miss (counted) or a bad key: get_one answers it as get() would
  // What get()'s kPieces load reads from a disk card (not a memory-speed one: copied from its mapping). One piece or
  // less: staged whatever the buffer's alignment, its CRC at the copy.
  if (device_->mapped() || device_->memory_backed()) return false;
  if (out->e.payload_bytes <= kGuardedPieceBytes) {
    out->bad = read_and_check(ctx, out->hash, out->e, &out->io, false, nullptr, nullptr, key);
    if (out->io.ok() && out->bad.empty()) out->other = staged_other_key(ctx, key);
    return true;
  }
  // More, inside a `pieces` call (the copy of a staged key before it): left to get_one, nothing asked. Its deliver()
  // and pieces would each take the caller's guard again on this thread while the copy's holds it (review of
  // restore37: a batch's std::shared_mutex taken shared twice by one thread, undefined; a writer-preferring lock
  // deadlocks where the completion's exclusive lock queues between the two).
  if (inside_pieces) return false;
  // Else read straight into its buffer (deliver() asked for it now), each piece under `pieces` as get() reads it;
  // its header, tail and CRC checked by finish_direct (get_one) while the key after it is read. An unaligned
  // buffer (get() stages it) is left to get_one, with deliver()'s answer (`asked`: not asked twice).
  uint8_t* dst = nullptr;
  out->delivered = deliver(out->e.payload_bytes, [&](uint8_t* d) {
    dst = d;
    return true;
  });
  if (out->delivered && reinterpret_cast<uintptr_t>(dst) % kBlockSize) {
    out->asked = true;
    out->dst = dst;
    return true;
  }
  out->direct = true;
  out->dst = dst;
  if (out->delivered)
    out->bad = read_and_check(ctx, out->hash, out->e, &out->io, true, dst, &pieces, key, piece_bytes, &out->epoch);
  return true;
}

std::string CardStore::finish_direct(IoContext& ctx, uint64_t hash, const IndexEntry& e, uint64_t epoch, Status* io,
                                     uint8_t* payload_dst, const PieceGuardFn* guard, std::string_view key,
                                     const AheadFn* ahead) {
  const size_t body = e.payload_bytes & ~(kBlockSize - 1);
  uint32_t body_crc;
  if (ahead) {
    ctx.crc_.start(payload_dst, body);
    body_crc = crc_beside(ctx.crc_, [ahead] { (*ahead)(false); });  // after its pieces, outside them
  } else {
    body_crc = crc32c(payload_dst, body);
  }
  std::string why =
      judge_read(ctx, hash, e, epoch, key, io, true, payload_dst, guard, ReadKind::kDirect, body_crc, nullptr);
  // Its CRC ran after its pieces returned, beside the next key's read (tens of ms on a disk): the buffer is the
  // caller's only while `guard` agrees. One it declines now may have been handed to another object meanwhile (the
  // future completed): no verdict on bytes that may not be the card's, a failure as a declined piece is.
  if (!why.empty() && guard && !(*guard)(e.payload_bytes, [] {})) {
    *io = Status::TimedOut("deadline passed while the object was checked");
    return std::string();
  }
  return why;
}

bool CardStore::staged_other_key(const IoContext& ctx, std::string_view key) {
  ObjectHeader hdr;
  std::memcpy(&hdr, ctx.staging_.data(), sizeof hdr);
  return std::string_view(reinterpret_cast<const char*>(ctx.staging_.data()) + sizeof hdr, hdr.key_bytes) != key;
}

void CardStore::get_each(IoContext& ctx, IoContext& other, const std::string_view* keys, size_t n, Status* results,
                         const DeliverEachFn& deliver, const PieceGuardFn& pieces, size_t piece_bytes) {
  const StoreCall call;
  const Foreground busy = device_->begin_foreground();
  IoContext* ctxs[2] = {&ctx, &other};
  StagedRead next;
  bool have_next = false;
  for (size_t i = 0; i < n; i++) {
    IoContext& c = *ctxs[i % 2];
    StagedRead cur;
    const bool have_cur = have_next;
    if (have_cur) cur = std::move(next);
    have_next = false;
    // Key i+1's lookup and read, into the other context, while key i's copy runs (once at most). Not where key i+1
    // is key i again: its object would be read before key i's load has judged it, and a damaged one counted and
    // logged twice (review35: get() found it gone from the index, a miss, as a fresh lookup now does).
    const bool read_ahead = i + 1 < n && keys[i + 1] != keys[i];
    // Its closure holds one pointer, which std::function keeps in place: a capture of each local by reference
    // (seven) would be allocated on the heap for every key.
    const auto read_next = [&](bool inside_pieces) {
      if (i + 1 < n && !have_next) {
        next = StagedRead{};
        const DeliverPayloadFn deliver_next = [&](size_t size, const CopyFn& copy) {
          return deliver(i + 1, size, copy);
        };
        have_next =
            stage_ahead(*ctxs[(i + 1) % 2], keys[i + 1], &next, deliver_next, pieces, piece_bytes, inside_pieces);
      }
    };
    const AheadFn ahead = [f = &read_next](bool inside_pieces) { (*f)(inside_pieces); };
    results[i] = get_one(
        c, keys[i], [&](size_t size, const CopyFn& copy) { return deliver(i, size, copy); }, ReadInto::kPieces, pieces,
        piece_bytes, have_cur ? &cur : nullptr, read_ahead ? &ahead : nullptr);
  }
}

Status CardStore::get_one(IoContext& ctx, std::string_view key, const DeliverPayloadFn& deliver, ReadInto into,
                          const PieceGuardFn& pieces, size_t piece_bytes, StagedRead* staged, const AheadFn* ahead) {
  ctx.store_ = this;
  uint64_t h;
  IndexEntry e;
  Status ls = staged ? staged->lookup : lookup(key, &h, &e);
  if (staged) h = staged->hash, e = staged->e;
  if (!ls.ok()) return ls;
  Status io;
  std::string bad;     // why the object is damaged (it is then dropped)
  bool other = false;  // another key with the same index hash
  // Reads the object (the payload into dst when given), checks header and
  // key (and the payload CRC if asked); true if it is key's intact object.
  auto read = [&](uint8_t* dst, bool check_payload, const PieceGuardFn* guard = nullptr) {
    bad = read_and_check(ctx, h, e, &io, check_payload, dst, guard, key, piece_bytes);
    if (!io.ok() || !bad.empty()) return false;
    other = staged_other_key(ctx, key);
    return !other;
  };
  // Copies a payload read into staging to dst, checking its CRC on the way. With `ahead` (get_each, a kPieces
  // load) the copy runs on ctx's CrcWorker while ahead() reads the next key's object on this thread, and is
  // waited for before this returns (inside `pieces`: nothing is written into dst after it), an exception too.
  // ahead(true): it runs inside `pieces` (or deliver()), so it takes neither again (stage_ahead).
  auto copy_staged = [&](uint8_t* dst) {
    ObjectHeader hdr;
    std::memcpy(&hdr, ctx.staging_.data(), sizeof hdr);
    uint32_t crc;
    if (ahead) {
      ctx.crc_.start_copy(dst, ctx.staging_.data() + kBlockSize, e.payload_bytes);
      crc = crc_beside(ctx.crc_, [ahead] { (*ahead)(true); });
    } else {
      crc = crc32c_copy(dst, ctx.staging_.data() + kBlockSize, e.payload_bytes);
    }
    if (crc == hdr.payload_crc) return true;
    bad = "payload checksum mismatch";
    return false;
  };
  // A direct read whose checks were deferred (read_and_check's deferred_epoch), read into dst without an error: its
  // CRC (beside ahead()), header and tail checked; true if it is key's intact object.
  auto finish = [&](uint8_t* dst, uint64_t epoch) {
    if (io.ok() && bad.empty()) {
      bad = finish_direct(ctx, h, e, epoch, &io, dst, &pieces, key, ahead);
      other = io.ok() && bad.empty() && staged_other_key(ctx, key);
    }
    return io.ok() && bad.empty() && !other;
  };
  bool delivered;
  if (into == ReadInto::kStaging) {
    delivered = read(nullptr, false) && deliver(e.payload_bytes, copy_staged);
  } else if (into == ReadInto::kPieces && staged && staged->direct) {
    // Read ahead straight into its buffer (stage_ahead: deliver() was asked then, and the pieces ran under `pieces`);
    // its CRC runs on ctx's CrcWorker while ahead() reads the next key's object, then header and tail are checked.
    io = staged->io, bad = staged->bad;
    delivered = staged->delivered && finish(staged->dst, staged->epoch);
  } else if (into == ReadInto::kPieces) {
    uint8_t* dst = nullptr;
    if (staged && staged->asked) {  // stage_ahead asked deliver() already (an unaligned buffer): once a key
      delivered = true;
      dst = staged->dst;
    } else {
      delivered = deliver(e.payload_bytes, [&](uint8_t* d) {
        dst = d;
        return true;
      });
    }
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
    const bool large = aligned && e.payload_bytes > kGuardedPieceBytes && !device_->memory_backed();
    if (delivered && !device_->mapped() && large && ahead) {
      // get_each: its CRC on ctx's CrcWorker while ahead() reads the next key's object (as a staged read ahead's).
      uint64_t epoch = 0;
      bad = read_and_check(ctx, h, e, &io, true, dst, &pieces, key, piece_bytes, &epoch);
      delivered = finish(dst, epoch);
    } else if (delivered && (device_->mapped() || large)) {
      delivered = read(dst, true, &pieces);
    } else if (delivered) {  // one piece or less, or unaligned: staged, then copied in one piece
      bool copied = false;
      bool got;
      if (staged && !staged->asked) {  // read ahead (get_each): stage_ahead took only what is staged here
        io = staged->io, bad = staged->bad, other = staged->other;
        got = io.ok() && bad.empty() && !other;
      } else {
        got = read(nullptr, false);
      }
      delivered = got && pieces(e.payload_bytes, [&] { copied = copy_staged(dst); }) && copied;
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
  // Every region the object has bytes in, as a load (read_and_check); allocates nothing. A broken chain (a
  // region reused meanwhile) cannot be indexed: the eviction that reused it erased the entry under this lock.
  const IndexEntry& e = it->second;
  for_each_part_locked(e.region, uint64_t(e.block) * kBlockSize, object_footprint(e.payload_bytes),
                       [this](uint32_t r, uint64_t, uint64_t) { regions_.touch(r); });
  return true;
}

}  // namespace adp
