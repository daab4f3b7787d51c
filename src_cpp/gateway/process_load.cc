// SPDX-License-Identifier: Apache-2.0
// A get item in the client's process memory (r5): written from the card
// piece by piece through this connection's bounce buffers, on its thread
// and the piece pool's helpers, each piece under the load lease.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "gateway/client_handler.h"
#include "gateway/handler_internal.h"
#include "util/load_profile.h"
#include "util/log.h"

namespace adp {
namespace {

using proto::Clock;

// ADP_TEST_PROCESS_WRITE_STALL_MS: taken by the first process write that stalls.
std::atomic<bool> g_process_stall_taken{false};

// Session eight (loads, larger pieces): with ADP_BOUNCE_PIECE_KB (the
// gateway's environment; a whole number of KiB, a multiple of 4 from 4 to
// 1024, e.g. 1024; anything else is ignored with a warning) an object
// that no helper may join when its load starts (no pool, or
// PiecePool::helpers_now() false: 16 connections on 16 CPUs) is written by
// its connection's thread alone in pieces of that size, fewer and larger
// process_vm_writev calls; helpers then do not join it even if one comes
// free later. Unset (or 256): every object in CardStore::kBouncePieceBytes
// pieces with helpers as before, the default, because the one A/B on the
// 16-core machine showed no gain at 2 MiB x 16 (+3%, within its spread) and
// a loss at 32 MiB x 16 (benchmarks/README.md, "Session eight: loads, larger
// pieces").
size_t solo_piece_bytes() {
  static const size_t v = [] {
    const char* e = std::getenv("ADP_BOUNCE_PIECE_KB");
    char* end = nullptr;
    const uint64_t kb = e ? std::strtoull(e, &end, 10) : 0;
    const bool digits_only = e && e[0] >= '0' && e[0] <= '9' && *end == '\0';  // no sign, space or unit
    if (digits_only && kb && kb % 4 == 0 && kb <= (CardStore::kLargeBouncePieceBytes >> 10)) return size_t(kb) << 10;
    if (e) ADP_WARN("ADP_BOUNCE_PIECE_KB=%s is not a whole number of KiB, a multiple of 4 from 4 to 1024: ignored", e);
    return CardStore::kBouncePieceBytes;
  }();
  return v;
}

}  // namespace

Status ClientHandler::load_into_process(const proto::BatchItem& it, uint64_t request_id, proto::Deadline deadline,
                                        bool* revoked) {
  namespace prof = load_profile;
  prof::Timer whole(prof::kObject);
  if (*revoked) return Status::TimedOut("the client gave up the load (lease revoked)");
  if (test_segment_delay_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(test_segment_delay_ms_));
  // The pid names this client only while it lives (docs/protocol.md, "Process memory": the pid reuse window):
  // checked before the object and before each of its pieces.
  if (!process_->alive()) return Status::Closed("the client process is gone");
  PiecePool* pool = shared_->pieces.get();
  if (!bounces_) {  // one bounce buffer for this thread and one for each helper an object may take
    bounce_slots_ = 1 + (pool ? pool->max_helpers() : 0);
    bounces_ = std::make_unique<AlignedBuffer[]>(bounce_slots_);
  }
  // The sink runs on this thread and on the pool's helpers at once, each
  // piece's write under the shared lease (join_lease).
  std::mutex failed_mu;
  Status failed;  // the first write that failed: the client gone, an address it does not have
  std::atomic<bool> gave_up{false};
  // The first failure, but Closed (the client gone, or the gateway stopped
  // without this connection) wins over any: it ends the request, and the
  // connection, before anything more of the server is touched (review r7 B1).
  auto fail = [&](Status s) {
    std::lock_guard<std::mutex> lock(failed_mu);
    if (failed.ok() || (s.code() == Status::Code::kClosed && failed.code() != Status::Code::kClosed))
      failed = std::move(s);
    return false;
  };
  auto sink_write = [&](size_t done, const uint8_t* src, size_t len) {
    // The request's deadline before each piece, not only each item (S1).
    if (Clock::now() >= deadline)
      return fail(Status::TimedOut("deadline passed in the gateway while the pieces went out"));
    bool alive;
    {
      prof::Timer t(prof::kAlive);
      alive = process_->alive();
    }
    if (!alive) return fail(Status::Closed("the client process is gone"));
    if (test_process_stall_ms_ && done > 0 && (!test_process_stall_on_helper_ || PiecePool::on_helper_thread()) &&
        !g_process_stall_taken.exchange(true)) {
      // Counted as a transfer of the client's memory (stop() may leave it behind), outside the lease.
      Status s = in_client_memory([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(test_process_stall_ms_));
        return Status::Ok();
      });
      if (!s.ok()) return fail(std::move(s));
    }
    bool joined;
    {
      prof::Timer t(prof::kLease);
      joined = join_lease(request_id, deadline);
    }
    if (!joined) {
      if (Clock::now() >= deadline)
        return fail(Status::TimedOut("deadline passed in the gateway while the pieces went out"));
      gave_up = true;
      return false;
    }
    LeaseLeave leave(*this, request_id);  // an exception's way out too (session 26)
    Status w = in_client_memory([&] {
      prof::Timer t(prof::kWrite);
      return process_->write(it.offset + done, src, len);
    });
    {
      prof::Timer t(prof::kLease);
      leave.now();
    }
    bump_alive();  // a piece out (review r10 N3): one object the card gives slowly does not read stalled
    return w.ok() || fail(std::move(w));
  };
  // Out of the card gate for the whole write: the lease may wait on writers
  // the client stalls. Back in only while the gate is open.
  auto sink = [&](size_t done, const uint8_t* src, size_t len) {
    prof::Timer t(prof::kSink);
    const bool in_card = t_in_card;
    card_leave(shared_->gate);
    const bool ok = sink_write(done, src, len);
    if (in_card && !card_enter(shared_->gate))
      return fail(Status::Closed("the gateway closed its card while this load's pieces went out"));
    return ok;
  };
  auto accept = [&](size_t size) {
    if (size == it.size) return true;
    ADP_WARN_LIMITED("object %s holds %zu bytes but the load buffer has %llu: served as a miss",
                     log_safe(it.key).c_str(), size, ull(it.size));
    return false;
  };
  // An IoContext only for a read from a card that is not memory-speed (or
  // a damaged object's tombstone), given back before any piece goes out.
  // The object then stays in hold_: its bytes are reserved first, within
  // --max-store-buffer-total-mb for the holds of all connections together.
  // A memory-speed card never reads into hold_ (its context is only for a
  // tombstone), so nothing is reserved there: else a total below an
  // object's size would answer Busy forever and never drop it (review r8).
  Status hold_refused;
  const bool into_hold = !shared_->store->memory_speed();
  auto with_ctx = [&](const std::function<void(IoContext&)>& fn) {
    if (into_hold) hold_refused = reserve_hold(kBlockSize + it.size);
    if (!hold_refused.ok()) return false;
    auto lease = acquire_context(deadline);
    if (lease) {
      fn(**lease);  // the read, and the swap into hold_
      note_card_work();
    }
    count_hold();
    return bool(lease);
  };
  // Each piece, on this thread or a helper, runs inside the card gate (a
  // helper freed after stop() may pick up this job: it finds the gate
  // closed and runs nothing). This thread is out of it while it waits for
  // the pieces (a helper's may stall), and a false return once the gate
  // closed meanwhile tells get_via_bounce to touch the store no more.
  CardGate& gate = shared_->gate;
  auto gated = [&gate](const PiecePool::PieceFn& piece) {
    return [&gate, &piece](size_t i, int slot) {
      load_profile::Timer t(load_profile::kPiece);
      CardSection in(gate);
      return in && piece(i, slot);
    };
  };
  // The piece size is fixed here, at the object's start: with other pieces
  // than 256 KiB (ADP_BOUNCE_PIECE_KB) no helper joins it (run alone), so one
  // writer holds the lease at a time and a revoke waits for at most one such
  // piece (docs/protocol.md).
  const size_t solo = solo_piece_bytes();
  const bool alone = solo != CardStore::kBouncePieceBytes && !(pool && pool->helpers_now());
  const size_t piece_bytes = alone ? solo : CardStore::kBouncePieceBytes;
  CardStore::RunPiecesFn run_pieces = [&](size_t n, const PiecePool::PieceFn& piece) {
    const PiecePool::PieceFn each = gated(piece);
    card_leave(gate);
    bool ok = true;
    if (pool)
      ok = pool->run(n, each, alone);
    else
      for (size_t i = 0; i < n && ok; i++) ok = each(i, 0);
    if (!card_enter(gate)) return fail(Status::Closed("the gateway closed its card while this load's pieces went out"));
    return ok;
  };
  if (!card_enter(gate)) return Status::Closed("the gateway is closing its card");
  Status st = shared_->store->get_via_bounce(it.key, accept, with_ctx, {bounces_.get(), bounce_slots_}, &hold_, sink,
                                             run_pieces, piece_bytes);
  if (gave_up) *revoked = true;
  if (Status e = ended(); !e.ok()) return e;
  if (!hold_refused.ok()) return hold_refused;
  if (!failed.ok()) return failed;
  if (*revoked) return Status::TimedOut("the client gave up the load (lease revoked)");
  if (st.ok()) shared_->process_loads.fetch_add(1, std::memory_order_relaxed);
  return st;
}

}  // namespace adp
