// SPDX-License-Identifier: Apache-2.0
// A put item in the client's process memory (r5): read into this
// connection's store buffer in pieces, on its thread and the piece pool's
// helpers (or on its store reader, session eight), each under the lease;
// and one large object stored while its store reader reads it (session
// eight: store_pipelined, the pipeline's bounds and slots).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
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

// Session eight: a process store of one object of at least this size on a
// memory-speed card is read by the connection's store reader while the
// connection's thread copies each piece into its reserved card place (the
// second pass then reads the cache, not memory: benchmarks/README.md,
// "Session eight: stores"); smaller objects go through the buffer whole.
// ADP_STORE_PIPELINE_MIN_MB (the gateway's environment) sets it; 0 turns it
// off (an A/B of the two paths in one run: benchmarks/README.md).
constexpr uint64_t kPipelineMinBytes = 8ull << 20;
uint64_t pipeline_min_bytes() {
  static const uint64_t v = [] {
    const char* e = std::getenv("ADP_STORE_PIPELINE_MIN_MB");
    return e ? std::strtoull(e, nullptr, 10) << 20 : kPipelineMinBytes;
  }();
  return v;
}

// How long the thread that holds the card place waits for the next piece
// (1 MiB, about 0.1 ms to read) before it abandons the place: the longest a
// client whose memory stalls the read holds back other connections'
// acknowledgements (the frontier's order) and an I/O context, once per
// connection per 30 s (ClientHandler::pipeline_retry_: it stores through the buffer alone
// meanwhile), and by at most GatewayShared::max_pipelined_stores at once.
constexpr int kPipelinePieceWaitMs = 200;
// And the longest it holds the place for the whole object (review r8 B2: a
// client that serves each piece just inside the piece's wait would hold it
// for the whole object): kPipelinePieceWaitMs plus the object's bytes at this
// rate (a reader of memory goes at 5-60 GB/s), so 262.5 ms for 32 MiB, 700 ms
// for 256 MiB; a slower read gives the place up as a stalled one does.
constexpr uint64_t kPipelineMinBytesPerSecond = 512ull << 20;
// An object's bytes at that rate, in microseconds: exact enough, and no
// overflow below 16 TiB, past --max-store-buffer-mb's top (1 TiB); in
// nanoseconds it overflowed past 17 GiB (review r9 N1).
constexpr std::chrono::microseconds pipeline_bytes_time(uint64_t bytes) {
  return std::chrono::microseconds(bytes * 1000000ull / kPipelineMinBytesPerSecond);
}
static_assert(pipeline_bytes_time(32ull << 20) == std::chrono::microseconds(62500));
static_assert(pipeline_bytes_time(64ull << 30) == std::chrono::seconds(128), "a 64 GiB object: no overflow");

// One of GatewayShared::max_pipelined_stores (review r8 S4), taken by a
// pipelined store once its reader has the first piece, with the card place
// and the I/O context (session nine: taken before it, a client that stalled
// at the start kept it), given back on every way out of it.
class PipelineSlot {
 public:
  PipelineSlot(GatewayShared& shared, bool want) : shared_(shared) {
    if (!want) return;
    uint32_t n = shared_.pipelined_stores.load(std::memory_order_relaxed);
    while (n < shared_.max_pipelined_stores &&
           !shared_.pipelined_stores.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel)) {
    }
    taken_ = n < shared_.max_pipelined_stores;
  }
  ~PipelineSlot() { release(); }
  void release() {
    if (taken_) shared_.pipelined_stores.fetch_sub(1, std::memory_order_acq_rel);
    taken_ = false;
  }
  PipelineSlot(const PipelineSlot&) = delete;
  PipelineSlot& operator=(const PipelineSlot&) = delete;
  bool taken() const { return taken_; }

 private:
  GatewayShared& shared_;
  bool taken_ = false;
};

// ADP_TEST_PROCESS_READ_STALL_MS: taken by the first process read that stalls.
std::atomic<bool> g_process_read_stall_taken{false};

// Whether this thread is a connection's store reader (tests: which reads wait).
thread_local bool t_store_reader = false;

}  // namespace

bool ClientHandler::post_to_reader(std::function<void()> job) {
  if (!reader_) {
    std::shared_ptr<StoreReader> r;
    try {
      // Tests only (ADP_TEST_STORE_READER_FAIL=post): no memory for the reader (its state, its thread's).
      if (shared_->hooks.store_reader_fail == "post") throw std::bad_alloc();
      r = std::make_shared<StoreReader>();
      r->thread = std::thread([r = r.get(), id = id_] {
        set_thread_name("adp-gw-sread", static_cast<int>(id));
        t_store_reader = true;
        std::unique_lock<std::mutex> l(r->mu);
        for (;;) {
          r->cv.wait(l, [r] { return r->quit || r->pending; });
          if (!r->pending) return;  // quit, and nothing left to run
          std::function<void()> run = std::move(r->job);
          l.unlock();
          run();  // never throws: post_read's job catches (session 26)
          run = nullptr;
          l.lock();
          r->pending = false;
          r->cv.notify_all();
        }
      });
    } catch (const std::exception& e) {
      // A thread limit (review r8 S3; std::system_error), or no memory for it (std::bad_alloc: session 26, it ended
      // the connection): the buffer path, as before.
      note_no_reader(e);
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

void ClientHandler::note_no_reader(const std::exception& e) {
  ADP_WARN_LIMITED("gateway: client #%llu: no store reader thread (%s): its stores go through the buffer", ull(id_),
                   dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory: std::bad_alloc" : e.what());
}

Status ClientHandler::reader_failure(const std::exception_ptr& thrown) {
  const char* why = "an exception of unknown type";
  bool memory = false;
  std::string text;
  try {
    std::rethrow_exception(thrown);
  } catch (const std::bad_alloc&) {
    memory = true;
    why = "out of memory: std::bad_alloc";
  } catch (const std::exception& e) {
    text = e.what();
    why = text.c_str();
  } catch (...) {
  }
  shared_->store_reader_failures.fetch_add(1, std::memory_order_relaxed);
  ADP_ERROR(
      "gateway: client #%llu (%s): the store reader failed reading a store from the client's memory (%s): that "
      "store fails, the connection goes on",
      ull(id_), peer().c_str(), why);
  // Never read as the card's failure (card_io_error.h): the gateway's own memory, its message's prefix for r8.
  if (memory)
    return Status::IoError(
        "out of memory: the gateway failed reading this object from the client's memory (std::bad_alloc)",
        Status::IoClass::kGatewayMemory);
  return Status::Busy(std::string("the gateway failed reading this object (") + why + ")");
}

bool ClientHandler::read_process_chunk(const proto::BatchRequest& req, size_t i, size_t end, proto::Deadline deadline,
                                       ProcessRead* pr, std::vector<PutItem>* items, std::vector<Status>* st,
                                       const std::function<void(size_t, size_t)>* on_piece,
                                       const std::function<void(size_t, uint8_t*)>* on_object) {
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
    Status st;    // the first piece that failed (under mu)
    size_t left;  // bytes not yet read (under mu)
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
    objs.push_back({k, store_buf_.data() + at, Status::Ok(), it.size});
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
  const bool reader_job = t_store_reader;  // this read is a store reader's job (its pieces on helpers too)
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
    LeaseLeave leave(*this, pr->request_id);  // an exception's way out too (session 26)
    Status s = in_client_memory([&] {
      // Tests only (ADP_TEST_STORE_READER_FAIL=read): a store reader job's piece (on the reader or a helper) throws
      // while it holds the lease.
      if (reader_job && shared_->hooks.store_reader_fail == "read") throw std::bad_alloc();
      if (test_process_read_stall_ms_ && (pc.off > 0) != test_process_read_stall_at_start_ &&
          (!test_process_stall_on_helper_ || PiecePool::on_helper_thread()) &&
          !g_process_read_stall_taken.exchange(true))
        std::this_thread::sleep_for(std::chrono::milliseconds(test_process_read_stall_ms_));
      if (test_process_read_delay_ms_ && t_store_reader)
        std::this_thread::sleep_for(std::chrono::milliseconds(test_process_read_delay_ms_));
      return process_->read(it.offset + pc.off, o.dst + pc.off, pc.len);
    });
    leave.now();
    if (s.code() == Status::Code::kClosed) {
      std::lock_guard<std::mutex> l(mu);
      gone = std::move(s);
      return false;
    }
    if (!s.ok()) return fail(std::move(s));
    shared_->process_read_bytes.fetch_add(pc.len, std::memory_order_relaxed);
    note_buffer_work();  // no context held: store-buffer waiters count it, context waiters do not (r10 R3b)
    if (on_piece) (*on_piece)(pc.off, pc.len);
    if (on_object) {
      bool whole;
      {
        std::lock_guard<std::mutex> l(mu);
        o.left -= pc.len;
        whole = o.left == 0 && o.st.ok();
      }
      if (whole) (*on_object)(o.k, o.dst);  // every byte of it is in the buffer
    }
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

// What a pipelined store's reader job reads and writes, held by the job and
// by the connection's thread (review r9 S1: the job refers to nothing of
// run_batch's or serve_batch's frames, so a batch that returns before the job
// has ended leaves it nothing freed to touch).
struct ClientHandler::PipelinedRead {
  PipelinedRead(const proto::BatchItem& it, uint64_t request_id, proto::Deadline deadline)
      : pr{request_id, deadline}, items(1), st(1) {
    req.items.push_back(it);
    req.items[0].key = {};  // a view into the request's frame; the read does not need it
    done.assign((it.size + kProcessReadPieceBytes - 1) / kProcessReadPieceBytes, 0);
    on_piece = [this](size_t off, size_t) {
      std::lock_guard<std::mutex> l(mu);
      done[off / kProcessReadPieceBytes] = 1;
      cv.notify_all();
    };
  }
  proto::BatchRequest req;  // the one item, copied: read_process_chunk's item 0
  ProcessRead pr;           // its deadline by value
  std::vector<PutItem> items;
  std::vector<Status> st;
  std::function<void(size_t, size_t)> on_piece;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint8_t> done;  // by piece of kProcessReadPieceBytes
  bool finished = false;      // the reader's job has ended
  std::exception_ptr thrown;  // set (before finished) when the job threw
};

Status ClientHandler::store_pipelined(const proto::BatchItem& first, uint64_t request_id, proto::Deadline deadline,
                                      Status* answer, Pipelined* how) {
  *how = Pipelined::kNot;
  CardStore& store = *shared_->store;
  if (reader_stalled_at_ && Clock::now() - *reader_stalled_at_ >= pipeline_retry_) reader_stalled_at_.reset();
  bool pipeline = !reader_stalled_at_ && pipeline_min_bytes() && first.size >= pipeline_min_bytes() &&
                  first.size <= store_object_limit() && store.memory_speed() && shared_->max_pipelined_stores > 0;
  const bool wanted = pipeline;
  if (pipeline && shared_->pieces && !shared_->pieces->spare_cpu()) pipeline = false;
  if (wanted && !pipeline) shared_->process_store_unpipelined_busy.fetch_add(1, std::memory_order_relaxed);
  if (!pipeline) return Status::Ok();
  const uint64_t need = (first.size + 4095) & ~uint64_t(4095);
  if (need > store_buf_.capacity()) {
    if (Status g = grow_store_buffer(need, deadline); !g.ok()) {
      *answer = std::move(g);
      *how = Pipelined::kAnswered;
      return Status::Ok();
    }
  }
  auto rd = std::make_shared<PipelinedRead>(first, request_id, deadline);
  // Waits for the reader out of the card gate (it may wait on the
  // client), holding nothing shared, then `delay_ms` more (tests: a thread
  // descheduled there); false: the card closed meanwhile.
  auto wait_out = [&](const std::function<bool()>& until, int delay_ms = 0) {
    card_leave(shared_->gate);
    {
      std::unique_lock<std::mutex> lk(rd->mu);
      rd->cv.wait(lk, until);
    }
    if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    return card_enter(shared_->gate);
  };
  const auto t0 = Clock::now();
  const bool posted = post_read(rd, [this](PipelinedRead& job) {
    read_process_chunk(job.req, 0, 1, job.pr.deadline, &job.pr, &job.items, &job.st, &job.on_piece);
  });
  if (!posted) {
    reader_stalled_at_ = Clock::now();  // no reader thread: the buffer path for a while
    return Status::Ok();
  }
  // The place is reserved only once the reader is ahead (its first
  // piece read): a client that stalls from the start holds nothing.
  // (Tests: ADP_TEST_PIPELINE_WAKE_DELAY_MS, so stop() can close the card
  // meanwhile, review r9 S1: tests/cpp/pipelined_stop_test.cc.)
  if (!wait_out([&] { return rd->done[0] || rd->finished; }, shared_->hooks.pipeline_wake_delay_ms)) {
    // The card closed (stop() gave up on this connection) with the reader
    // past its first piece: it ends first (it holds its own state, but
    // reads into this connection's store buffer); its pieces left fail at
    // once (in_client_memory: abandoned).
    {
      std::unique_lock<std::mutex> lk(rd->mu);
      rd->cv.wait(lk, [&] { return rd->finished; });
    }
    abandoned_ = true;
    return Status::Closed("the gateway closed its card while this store's pieces were read");
  }
  bool ahead;
  {
    std::lock_guard<std::mutex> l(rd->mu);
    ahead = rd->done[0];
  }
  // A slot only now, with the card place and the I/O context: a
  // client stalled before its first piece holds none. None free:
  // the object is stored from the buffer once read, as a stalled one.
  PipelineSlot slot(*shared_, ahead);
  const bool no_slot = ahead && !slot.taken();
  if (no_slot) shared_->process_store_unpipelined_busy.fetch_add(1, std::memory_order_relaxed);
  bool stalled = false;
  Status put_st = Status::TimedOut("the read from the client's memory ended early");
  std::unique_ptr<IoContextPool::Lease> lease;
  if (slot.taken()) lease = acquire_context(deadline);
  if (slot.taken() && !lease) put_st = Status::TimedOut("no I/O context came free before the deadline");
  if (slot.taken() && lease) {
    const uint8_t* buf = store_buf_.data();
    const auto hold_by =
        Clock::now() + std::chrono::milliseconds(kPipelinePieceWaitMs) + pipeline_bytes_time(first.size);
    PutItem item{first.key, nullptr, first.size};
    item.fill = [&](uint8_t* dst, uint64_t off, size_t len) {
      for (size_t done = 0; done < len;) {
        const size_t at = off + done, p = at / kProcessReadPieceBytes;
        const size_t l = std::min<size_t>(len - done, (p + 1) * kProcessReadPieceBytes - at);
        {
          // Each piece within kPipelinePieceWaitMs, the object by hold_by.
          const auto by = std::min(Clock::now() + std::chrono::milliseconds(kPipelinePieceWaitMs), hold_by);
          std::unique_lock<std::mutex> lk(rd->mu);
          if (!rd->cv.wait_until(lk, by, [&] { return rd->done[p] || rd->finished; })) {
            stalled = true;
            shared_->process_store_stalls.fetch_add(1, std::memory_order_relaxed);
            return Status::TimedOut("the client's memory stalled the read: its card place is given up");
          }
          if (!rd->done[p]) return Status::TimedOut("the read from the client's memory ended early");
        }
        std::memcpy(dst + done, buf + at, l);  // CardStore checksums it where it landed, in the cache
        done += l;
        note_card_work();  // a piece into the card's write, under the context
      }
      return Status::Ok();
    };
    store.put(**lease, &item, 1, &put_st, [&] { return Clock::now() < deadline; });
    lease.reset();
    note_card_work();
    if (stalled) slot.release();  // the card place is given up: another may pipeline
  }
  const auto t1 = Clock::now();
  if (!wait_out([&] { return rd->finished; })) {
    abandoned_ = true;
    return Status::Closed("the gateway closed its card while this store's pieces were read");
  }
  // The reader's job threw (session 26): this store fails with the reason (a put cut short by it, "ended early",
  // is not the answer), the connection goes on.
  if (rd->thrown) {
    *answer = reader_failure(rd->thrown);
    *how = Pipelined::kAnswered;
    return Status::Ok();
  }
  using std::chrono::duration_cast, std::chrono::nanoseconds;
  shared_->process_store_put_ns.fetch_add(duration_cast<nanoseconds>(t1 - t0).count(), std::memory_order_relaxed);
  shared_->process_store_read_ns.fetch_add(duration_cast<nanoseconds>(Clock::now() - t1).count(),
                                           std::memory_order_relaxed);
  if (!rd->pr.gone.ok()) return rd->pr.gone;  // the client process exited (or stop() gave up)
  if (rd->pr.revoked) {
    *how = Pipelined::kRevoked;
    return Status::Ok();
  }
  if (stalled && !reader_stalled_at_) {
    // This connection's stores go through the buffer alone for a while.
    reader_stalled_at_ = Clock::now();
    ADP_WARN_LIMITED(
        "gateway: client #%llu (%s): its memory stalled a store's read for over %d ms: "
        "its stores go through the store buffer alone for %d s",
        ull(id_), peer().c_str(), kPipelinePieceWaitMs,
        static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(pipeline_retry_).count()));
  }
  if (!rd->st[0].ok() || put_st.ok() || !(stalled || no_slot)) {
    // Stored; or the read failed (its status is the answer), or the
    // card store did (the deadline, the card).
    *answer = !rd->st[0].ok() ? std::move(rd->st[0]) : std::move(put_st);
    if (answer->ok()) {
      shared_->process_stores.fetch_add(1, std::memory_order_relaxed);
      shared_->process_store_pipelined.fetch_add(1, std::memory_order_relaxed);
    }
    *how = Pipelined::kAnswered;
    return Status::Ok();
  }
  *how = Pipelined::kReadWhole;  // stalled (or no slot), and read whole since
  return Status::Ok();
}

}  // namespace adp
