// SPDX-License-Identifier: Apache-2.0
// A put item in the client's process memory (r5): read into this
// connection's store buffer in pieces, on its thread and the piece pool's
// helpers (or on its store reader, session eight), each under the lease.
#include <atomic>
#include <mutex>
#include <system_error>
#include <thread>

#include "gateway/client_handler.h"
#include "gateway/handler_internal.h"
#include "util/log.h"
#include "util/thread_name.h"

namespace adp {
namespace {

using proto::Clock;

// ADP_TEST_PROCESS_READ_STALL_MS: taken by the first process read that stalls.
std::atomic<bool> g_process_read_stall_taken{false};

// Whether this thread is a connection's store reader (tests: which reads wait).
thread_local bool t_store_reader = false;

}  // namespace

bool ClientHandler::post_to_reader(std::function<void()> job) {
  if (!reader_) {
    auto r = std::make_shared<StoreReader>();
    try {
      r->thread = std::thread([r = r.get(), id = id_] {
        set_thread_name("adp-gw-sread", static_cast<int>(id));
        t_store_reader = true;
        std::unique_lock<std::mutex> l(r->mu);
        for (;;) {
          r->cv.wait(l, [r] { return r->quit || r->pending; });
          if (!r->pending) return;  // quit, and nothing left to run
          std::function<void()> run = std::move(r->job);
          l.unlock();
          run();
          run = nullptr;
          l.lock();
          r->pending = false;
          r->cv.notify_all();
        }
      });
    } catch (const std::system_error& e) {  // a thread limit (review r8 S3): the buffer path, as before
      ADP_WARN_LIMITED("gateway: client #%llu: no store reader thread (%s): its stores go through the buffer", ull(id_),
                       e.what());
      return false;
    }
    reader_ = std::move(r);
  }
  std::unique_lock<std::mutex> l(reader_->mu);
  reader_->cv.wait(l, [this] { return !reader_->pending; });  // the one before has ended
  reader_->job = std::move(job);
  reader_->pending = true;
  reader_->cv.notify_all();
  return true;
}

bool ClientHandler::read_process_chunk(const proto::BatchRequest& req, size_t i, size_t end, proto::Deadline deadline,
                                       ProcessRead* pr, std::vector<PutItem>* items, std::vector<Status>* st,
                                       const std::function<void(size_t, size_t)>* on_piece) {
  const uint64_t cap = store_object_limit();
  uint64_t need = 0;
  for (size_t k = i; k < end; k++)
    if (req.items[k].segment == proto::kProcessSegment && req.items[k].size <= cap)
      need += (req.items[k].size + 4095) & ~uint64_t(4095);  // each object 4 KiB aligned (O_DIRECT from it)
  if (need > store_buf_.capacity()) {
    Status s = grow_store_buffer(need, deadline);
    if (!s.ok()) {
      for (size_t k = i; k < end; k++)
        if (req.items[k].segment == proto::kProcessSegment) (*st)[k] = s;
      return true;
    }
  }
  // The chunk's objects laid out in the buffer (4 KiB aligned), then read in
  // pieces of kProcessReadPieceBytes on this thread and on helpers of the
  // piece pool at once, each piece under the shared lease, the client's
  // liveness and the deadline checked before each. A helper stalled in a
  // piece holds back this connection only (PiecePool: no job waits for a
  // helper to come free), and nothing shared is held while it reads.
  struct Piece {
    size_t obj;  // index in objs
    size_t off, len;
  };
  struct Obj {
    size_t k;
    uint8_t* dst;
    Status st;  // the first piece that failed (under mu)
  };
  std::vector<Obj> objs;
  std::vector<Piece> pieces;
  uint64_t at = 0;
  for (size_t k = i; k < end; k++) {
    const proto::BatchItem& it = req.items[k];
    if (it.segment != proto::kProcessSegment) continue;
    if (it.size > cap) {
      const ConnectionLimits& lim = shared_->limits;
      const char* option = lim.max_store_buffer_total_bytes < lim.max_store_buffer_bytes ? "--max-store-buffer-total-mb"
                                                                                         : "--max-store-buffer-mb";
      ADP_WARN_LIMITED(
          "gateway: client #%llu: an object of %llu bytes is larger than the store buffer (%llu MiB, %s): refused",
          ull(id_), ull(it.size), ull(cap >> 20), option);
      (*st)[k] = Status::InvalidArgument("an object of " + std::to_string(it.size) +
                                         " bytes is larger than the gateway's store buffer for process memory (" +
                                         std::to_string(cap >> 20) + " MiB, " + option + ")");
      continue;
    }
    if (Clock::now() >= deadline) {
      (*st)[k] = Status::TimedOut("deadline passed in the gateway: not written");
      continue;
    }
    objs.push_back({k, store_buf_.data() + at, Status::Ok()});
    for (size_t off = 0; off < it.size; off += kProcessReadPieceBytes)
      pieces.push_back({objs.size() - 1, off, std::min<size_t>(it.size - off, kProcessReadPieceBytes)});
    at += (it.size + 4095) & ~uint64_t(4095);
  }
  if (pieces.empty()) return true;
  PiecePool* pool = shared_->pieces.get();
  if (!bounce_slots_) bounce_slots_ = 1 + (pool ? pool->max_helpers() : 0);  // join_lease's bound
  std::mutex mu;
  bool revoked = false;
  Status gone;
  auto piece = [&](size_t p, int) {
    const Piece& pc = pieces[p];
    Obj& o = objs[pc.obj];
    const proto::BatchItem& it = req.items[o.k];
    {
      std::lock_guard<std::mutex> l(mu);
      if (revoked || !gone.ok()) return false;
      if (!o.st.ok()) return true;  // its object failed: the rest of it is not read
    }
    auto fail = [&](Status s) {
      std::lock_guard<std::mutex> l(mu);
      if (o.st.ok()) o.st = std::move(s);
      return true;
    };
    // Tests: slow before each object, outside the lease.
    if (pc.off == 0 && test_segment_delay_ms_)
      std::this_thread::sleep_for(std::chrono::milliseconds(test_segment_delay_ms_));
    if (Clock::now() >= deadline) return fail(Status::TimedOut("deadline passed in the gateway: not written"));
    // The pid names this client only while it lives (docs/protocol.md, "Process memory": the pid reuse window):
    // checked before each piece.
    if (!process_->alive()) {
      std::lock_guard<std::mutex> l(mu);
      gone = Status::Closed("the client process is gone");
      return false;
    }
    if (!join_lease(pr->request_id, deadline)) {
      if (Clock::now() >= deadline) return fail(Status::TimedOut("deadline passed in the gateway: not written"));
      std::lock_guard<std::mutex> l(mu);
      revoked = true;
      return false;
    }
    Status s = in_client_memory([&] {
      if (test_process_read_stall_ms_ && (pc.off > 0) != test_process_read_stall_at_start_ &&
          (!test_process_stall_on_helper_ || PiecePool::on_helper_thread()) &&
          !g_process_read_stall_taken.exchange(true))
        std::this_thread::sleep_for(std::chrono::milliseconds(test_process_read_stall_ms_));
      if (test_process_read_delay_ms_ && t_store_reader)
        std::this_thread::sleep_for(std::chrono::milliseconds(test_process_read_delay_ms_));
      return process_->read(it.offset + pc.off, o.dst + pc.off, pc.len);
    });
    leave_lease(pr->request_id);
    if (s.code() == Status::Code::kClosed) {
      std::lock_guard<std::mutex> l(mu);
      gone = std::move(s);
      return false;
    }
    if (!s.ok()) return fail(std::move(s));
    shared_->process_read_bytes.fetch_add(pc.len, std::memory_order_relaxed);
    note_alive();
    if (on_piece) (*on_piece)(pc.off, pc.len);
    return true;
  };
  // Out of the card gate for the reads (they touch no card): this thread
  // may wait on helpers, or on the lease, that the client stalls. Back in
  // only while the gate is open.
  const bool in_card = t_in_card;
  card_leave(shared_->gate);
  if (pool) {
    pool->run(pieces.size(), piece);
  } else {
    for (size_t p = 0; p < pieces.size(); p++)
      if (!piece(p, 0)) break;
  }
  if (in_card && !card_enter(shared_->gate)) {
    abandoned_ = true;
    gone = Status::Closed("the gateway closed its card while this store's pieces were read");
  }
  if (!gone.ok()) pr->gone = gone;
  if (revoked) pr->revoked = true;
  if (!pr->gone.ok() || pr->revoked) return false;
  for (Obj& o : objs) {
    if (o.st.ok())
      (*items)[o.k].data = o.dst;
    else
      (*st)[o.k] = std::move(o.st);
  }
  return true;
}

}  // namespace adp
