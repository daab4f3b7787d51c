// SPDX-License-Identifier: Apache-2.0
#include "transport/embedded_backend.h"

#include <chrono>
#include <cstdint>
#include <new>
#include <optional>
#include <span>
#include <vector>

namespace adp {
namespace {

// A disk card's object larger than 4 MiB is read straight into LMCache's
// buffer in pieces of up to this size, the header block in the first one's
// request, each under the batch's guard and started before its deadline: an
// LMCache chunk (32 MiB by default) in one request, as fs_native reads it.
// With 4 MiB pieces (and the header read alone) the card's 4 workers made 9
// requests per 32 MiB object, each waiting its turn in the disk's queue, and
// the CRC of each piece ran between them (an MP server's prefetch on this
// 2-CPU VM under strace: 11% of each worker's time between reads, 5-7% in
// header reads; benchmarks/results/2026-12-04-*-diskload.md, -oneread.md).
// The price: a load past its deadline completes as failed when its piece in
// flight ends, one 32 MiB read (tens of ms on a disk) instead of 4 MiB.
constexpr size_t kDiskLoadPieceBytes = 32u << 20;

// A worker of a durable disk card takes the store slices queued behind its
// own, up to this many bytes, and stores them with one sync (put_slices).
// A sync a slice of 2 x 256 KiB held durable stores on this VM's disk to
// 0.83x of durable=false (0.3-0.5x in a quiet moment); taken together, 0.94x
// (benchmarks/results/2026-12-04-0930-storesync.md). The gateway's chunk
// (16 MiB, one sync each) is bounded alike.
constexpr uint64_t kPutSlicesBytes = 16u << 20;

class EmbeddedSession : public BackendSession {
 public:
  explicit EmbeddedSession(std::shared_ptr<CardStore> store) : store_(std::move(store)) {}
  ~EmbeddedSession() override {
    // Gives back this worker's staging memory and ends its CRC thread (IoContext) before the session lets go of the
    // store, as the members' order would anyway (ctx_ is declared after store_). Nothing is written: the card has
    // one frontier that every worker appends to, no region of this worker's to seal.
    ctx_.reset();
    ahead_ctx_.reset();
  }

  // The store writes from the caller's buffers, then checks that the store is
  // still wanted: bytes it indexes were read before the future completed.
  void put(const PutItem* items, size_t n, Status* results, Deadline, const GuardedReadFn& guarded) override {
    store_->put(*ctx_, items, n, results, [&guarded] { return guarded([] {}); });
  }

  // Not on a memory-speed card: its sync costs nothing.
  uint64_t put_slices_bytes() const override {
    return store_->durable() && !store_->memory_speed() ? kPutSlicesBytes : 0;
  }

  // One put of every slice's items, one sync: an item is indexed only if its
  // slice's batch still wants it once the sync is done (asked once a slice).
  // With `more`, the store slices queued while these were written (asked once,
  // after their writes) are written before that sync, and it covers them all
  // (CardStore::SyncShare): a worker with store slices queued behind its run
  // pays one sync for both, instead of one now and one for the next run.
  void put_slices(const PutSlice* slices, size_t count, const MoreSlicesFn* more) override {
    CardStore::SyncShare share;
    share.written = &written_hook;  // the connector's worker lets its lane's other thread write (overlaps_store_syncs)
    if (more)
      share.before_sync = [this, more](uint64_t since, std::span<const uint32_t> pins) -> std::optional<Status> {
        const PutSlice* extra = nullptr;
        const size_t k = (*more)(&extra);
        if (k == 0) return std::nullopt;
        CardStore::SyncShare second;  // no before_sync: one put deferred a run, so the first waits for one more
        second.since = since;
        second.pins = pins;  // the first's objects' regions, held until its commit: not waited for
        second.written = &written_hook;
        try {
          put_group(extra, k, &second);
        } catch (const std::bad_alloc&) {
          // Each item's result is already its own (put_group): failed "out of memory" where the put did not reach
          // it or did not index it, Ok where put_each's commit indexed it before the exception (review36: reported
          // failed until debt37, though on the card and visible). One out of the put itself (put_each) left a card
          // store operation: the store's shared state may be half made (card_store_unwound), so it goes on out of
          // the first put and put_slices, whose caller ends the process (the connector's fail_slices), as one out of
          // the first put's does (review37a: until then the first put synced and committed past it, and the
          // process went on marked unwound). One before the put (its items' copies): the first makes its own sync.
          if (card_store_unwound()) throw;
          return std::nullopt;
        }
        return second.result;
      };
    put_group(slices, count, &share);
  }

  void get(const std::string_view* keys, const size_t*, uint8_t* const*, size_t n, Status* results, Deadline deadline,
           const DeliverFn& deliver, const GuardedReadFn& guarded) override {
    // A piece starts only before the deadline: the batch's guard alone would
    // not stop it (a reader-preferring lock lets pieces of other workers in
    // ahead of the deadline thread), so past the deadline none starts and the
    // future completes once the pieces in flight are done.
    PieceGuardFn pieces = [&](size_t, const std::function<void()>& piece) {
      return std::chrono::steady_clock::now() < deadline && guarded(piece);
    };
    // A slice of several keys from a disk card: the next key's object is read while this one's is copied
    // (CardStore::get_each; 256 KiB objects left the disk idle between a worker's reads, session 35).
    if (into_ == ReadInto::kPieces && n > 1) {
      if (!ahead_ctx_) ahead_ctx_ = std::make_unique<IoContext>();
      store_->get_each(*ctx_, *ahead_ctx_, keys, n, results, deliver, pieces, kDiskLoadPieceBytes);
      return;
    }
    for (size_t i = 0; i < n; i++)
      results[i] = store_->get(
          *ctx_, keys[i], [&](size_t size, const CopyFn& copy) { return deliver(i, size, copy); }, into_, pieces,
          kDiskLoadPieceBytes);
  }

  void exists(const std::string_view* keys, size_t n, Status* results, Deadline) override {
    for (size_t i = 0; i < n; i++)
      results[i] = store_->exists(keys[i]) ? Status::Ok() : Status::NotFound("not on the card");
  }

  void remove(const std::string_view* keys, size_t n, Status* results, Deadline) override {
    for (size_t i = 0; i < n; i++) results[i] = store_->remove(*ctx_, keys[i]);
  }

 private:
  // The slices' items as one put_each (its sync shared as `share` says). A std::bad_alloc is passed on once each
  // slice's results are set, each item's its own: failed "out of memory" before its put (none of them made, or
  // put_each not begun), Ok where put_each indexed it before the exception (it is on the card and visible: from its
  // commit, review36), failed where it was not (CardStore::put_each's undo).
  void put_group(const PutSlice* slices, size_t count, CardStore::SyncShare* share) {
    auto out_of_memory = [&] {  // allocates nothing
      for (size_t s = 0; s < count; s++)
        for (size_t j = 0; j < slices[s].n; j++)
          slices[s].results[j] = Status::IoError("out of memory", Status::IoClass::kGatewayMemory);
    };
    std::vector<PutItem> items;
    std::vector<size_t> slice_of;
    std::vector<Status> results;
    std::vector<int8_t> wanted;
    try {
      for (size_t s = 0; s < count; s++) {
        items.insert(items.end(), slices[s].items, slices[s].items + slices[s].n);
        slice_of.insert(slice_of.end(), slices[s].n, s);
      }
      results.assign(items.size(), Status::IoError("out of memory", Status::IoClass::kGatewayMemory));
      wanted.assign(count, -1);
    } catch (const std::bad_alloc&) {
      out_of_memory();
      throw;
    }
    auto hand_out = [&] {  // moves: allocates nothing
      for (size_t s = 0, i = 0; s < count; s++)
        for (size_t j = 0; j < slices[s].n; j++) slices[s].results[j] = std::move(results[i++]);
    };
    try {
      store_->put_each(
          *ctx_, items.data(), items.size(), results.data(),
          [&](size_t i) {
            const size_t s = slice_of[i];
            if (wanted[s] < 0) wanted[s] = (*slices[s].guarded)([] {});
            return wanted[s] > 0;
          },
          share);
    } catch (const std::bad_alloc&) {
      hand_out();
      throw;
    }
    hand_out();
  }

  std::shared_ptr<CardStore> store_;
  // A memory-speed card is read straight into LMCache's buffer: the read
  // then takes a memcpy's time under the batch's deadline guard. Any other
  // card is read into it in pieces of kDiskLoadPieceBytes (an object of
  // 4 MiB or less: staged, then copied), each under the guard and before the
  // deadline, so a slow card holds up a deadline by one piece's read at most.
  const ReadInto into_ = store_->memory_speed() ? ReadInto::kDestination : ReadInto::kPieces;
  std::unique_ptr<IoContext> ctx_ = std::make_unique<IoContext>();
  // get_each's second context (its staging holds the next key's object while ctx_'s is copied out), made at the
  // first load of several keys: a worker that loads none keeps no second staging buffer.
  std::unique_ptr<IoContext> ahead_ctx_;
};

}  // namespace

std::unique_ptr<BackendSession> EmbeddedBackend::new_session() { return std::make_unique<EmbeddedSession>(store_); }

std::string EmbeddedBackend::describe() const { return "embedded card " + store_->path(); }

}  // namespace adp
