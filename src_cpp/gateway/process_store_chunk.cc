// SPDX-License-Identifier: Apache-2.0
// A put chunk of several process-memory objects (session ten, issue 10
// item 2): the connection's store reader reads them in order into the store
// buffer (read_process_chunk, the piece helpers included) while the
// connection's thread puts each object, or each run of them, as soon as it
// is read whole. Per object that is about max(read, put) instead of their
// sum (benchmarks/README.md, "Session ten: a chunk's reads beside its
// puts"). Unlike store_pipelined (one large object, process_store.cc), no
// card place and no I/O context is held while this thread waits for the
// reader: an object is put only once its bytes are all in the buffer, so a
// client that stalls a read holds back its own connection only
// (docs/protocol.md, "Process memory").
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "gateway/client_handler.h"
#include "gateway/handler_internal.h"

namespace adp {
namespace {

using proto::Clock;

// Off unless ADP_STORE_CHUNK_OVERLAP=1 (the gateway's environment): the
// 16-core A/B (benchmarks/README.md, "Session ten: a chunk's reads beside its
// puts") showed no gain outside the run's scatter (2 MiB x 4: 0.69x -> 0.73x),
// so the default stays the buffer path (review r10 R4).
bool chunk_overlap_enabled() {
  static const bool v = [] {
    const char* e = std::getenv("ADP_STORE_CHUNK_OVERLAP");
    return e && std::string_view(e) == "1";
  }();
  return v;
}

}  // namespace

// What the reader job reads and writes, held by the job and by the
// connection's thread (review r9 S1: the job refers to nothing of run_batch's
// or serve_batch's frames). The thread still waits for the job's end before
// it leaves the chunk: the job reads into this connection's store buffer.
struct ClientHandler::ChunkRead {
  ChunkRead(const proto::BatchRequest& from, size_t i, size_t end, uint64_t request_id, proto::Deadline deadline)
      : pr{request_id, deadline}, items(end - i), st(end - i), ready(end - i, nullptr) {
    req.items.assign(from.items.begin() + i, from.items.begin() + end);
    for (auto& it : req.items) it.key = {};  // views into the request's frame; the read does not need them
    on_object = [this](size_t k, uint8_t* data) {
      std::lock_guard<std::mutex> l(mu);
      ready[k] = data;
      cv.notify_all();
    };
  }
  proto::BatchRequest req;  // the chunk's items, copied: read_process_chunk's items 0 .. end - i
  ProcessRead pr;           // its deadline by value
  std::vector<PutItem> items;
  std::vector<Status> st;
  std::function<void(size_t, uint8_t*)> on_object;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint8_t*> ready;  // by object: its bytes in the store buffer, once read whole
  bool finished = false;        // the reader's job has ended
  std::exception_ptr thrown;    // set (before finished) when the job threw
};

Status ClientHandler::store_chunk_overlapped(const proto::BatchRequest& req, uint64_t request_id, size_t i, size_t end,
                                             proto::Deadline deadline, std::vector<Status>* st, Overlapped* how) {
  *how = Overlapped::kNot;
  CardStore& store = *shared_->store;
  if (!chunk_overlap_enabled() || !store.memory_speed()) return Status::Ok();
  for (size_t k = i; k < end; k++)
    if (req.items[k].segment != proto::kProcessSegment) return Status::Ok();
  // A connection whose reader could not start (store_pipelined's rule: the buffer path for a while).
  if (reader_stalled_at_ && Clock::now() - *reader_stalled_at_ >= pipeline_retry_) reader_stalled_at_.reset();
  if (reader_stalled_at_) return Status::Ok();
  // A second thread of the connection: only while a CPU is spare beside each (PiecePool::spare_cpu()).
  if (shared_->pieces && !shared_->pieces->spare_cpu()) return Status::Ok();
  // The buffer for the chunk, on this thread (the reader then finds it
  // large enough, as read_process_chunk sizes it): never remapped under it.
  const uint64_t cap = store_object_limit();
  uint64_t need = 0;
  for (size_t k = i; k < end; k++)
    if (req.items[k].size <= cap) need += (req.items[k].size + 4095) & ~uint64_t(4095);
  if (need > store_buf_.capacity()) {
    if (Status g = grow_store_buffer(need, deadline); !g.ok()) {
      for (size_t k = i; k < end; k++) (*st)[k] = g;
      *how = Overlapped::kDone;
      return Status::Ok();
    }
  }
  auto rd = std::make_shared<ChunkRead>(req, i, end, request_id, deadline);
  const size_t m = end - i;
  const bool posted = post_read(rd, [this](ChunkRead& job) {
    read_process_chunk(job.req, 0, job.req.items.size(), job.pr.deadline, &job.pr, &job.items, &job.st, nullptr,
                       &job.on_object);
  });
  if (!posted) {
    reader_stalled_at_ = Clock::now();  // no reader thread: the buffer path for a while
    return Status::Ok();
  }
  uint64_t wait_ns = 0, put_ns = 0;
  // Waits for the reader out of the card gate (it may wait on the client),
  // holding nothing shared; false: the card closed meanwhile (stop() gave up
  // on this connection), and the job has ended.
  auto wait_out = [&](const std::function<bool()>& until) {
    const auto t0 = Clock::now();
    card_leave(shared_->gate);
    {
      std::unique_lock<std::mutex> lk(rd->mu);
      rd->cv.wait(lk, until);
    }
    wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    if (card_enter(shared_->gate)) return true;
    {
      std::unique_lock<std::mutex> lk(rd->mu);  // its pieces left fail at once (in_client_memory: abandoned)
      rd->cv.wait(lk, [&] { return rd->finished; });
    }
    abandoned_ = true;
    return false;
  };
  const Status card_closed = Status::Closed("the gateway closed its card while this store's pieces were read");
  std::vector<uint8_t> answered(m, 0);
  std::vector<PutItem> run;
  std::vector<size_t> run_at;  // by object
  std::vector<Status> run_st;
  // Puts run: an I/O context for the put alone, none while waiting.
  auto put_run = [&] {
    if (run.empty()) return;
    run_st.assign(run.size(), Status::Ok());
    std::unique_ptr<IoContextPool::Lease> lease;
    if (Clock::now() < deadline) lease = acquire_context(deadline);
    if (Clock::now() >= deadline) {
      run_st.assign(run.size(), Status::TimedOut("deadline passed in the gateway: not written"));
    } else if (!lease) {
      run_st.assign(run.size(), Status::TimedOut("no I/O context came free before the deadline"));
    } else {
      const auto t0 = Clock::now();
      store.put(**lease, run.data(), run.size(), run_st.data(), [&] { return Clock::now() < deadline; });
      put_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      note_card_work();  // stored under the context
    }
    for (size_t t = 0; t < run.size(); t++) {
      const size_t o = run_at[t];
      (*st)[i + o] = std::move(run_st[t]);
      answered[o] = 1;
      if ((*st)[i + o].ok()) {
        shared_->process_stores.fetch_add(1, std::memory_order_relaxed);
        shared_->process_store_overlapped.fetch_add(1, std::memory_order_relaxed);
      }
    }
    run.clear();
    run_at.clear();
  };
  // In order: the next object not yet put, once read whole (with those read
  // whole after it), or the job's end (it failed, or the read ended early).
  size_t next = 0;
  for (bool finished = false; next < m && !finished;) {
    if (!wait_out([&] { return rd->finished || rd->ready[next]; })) return card_closed;
    {
      std::lock_guard<std::mutex> l(rd->mu);
      finished = rd->finished;
      for (; next < m && rd->ready[next]; next++) {
        run.push_back({req.items[i + next].key, rd->ready[next], req.items[i + next].size});
        run_at.push_back(next);
      }
    }
    if (Status e = ended(); !e.ok()) {  // stop() began: the job ends first (it reads into store_buf_)
      run.clear();
      wait_out([&] { return rd->finished; });
      return e;
    }
    put_run();
  }
  if (!wait_out([&] { return rd->finished; })) return card_closed;
  *how = Overlapped::kDone;
  if (rd->thrown) {
    // The reader's job threw (session 26): the objects not put yet fail with the reason, the connection goes on.
    const Status failed = reader_failure(rd->thrown);
    for (size_t o = 0; o < m; o++)
      if (!answered[o]) (*st)[i + o] = failed;
    shared_->process_store_read_ns.fetch_add(wait_ns, std::memory_order_relaxed);
    shared_->process_store_put_ns.fetch_add(put_ns, std::memory_order_relaxed);
    return Status::Ok();
  }
  shared_->process_store_read_ns.fetch_add(wait_ns, std::memory_order_relaxed);
  if (!rd->pr.gone.ok()) return rd->pr.gone;  // the client process exited (or stop() gave up)
  if (rd->pr.revoked) {
    for (size_t o = 0; o < m; o++)
      if (!answered[o]) (*st)[i + o] = Status::TimedOut("the client gave up the store (lease revoked): not written");
    *how = Overlapped::kRevoked;
    shared_->process_store_put_ns.fetch_add(put_ns, std::memory_order_relaxed);
    return Status::Ok();
  }
  // The objects not put yet: failed (the reader's status), or read whole
  // after one before them failed (put now, together).
  for (size_t o = 0; o < m; o++) {
    if (answered[o]) continue;
    if (!rd->st[o].ok()) {
      (*st)[i + o] = std::move(rd->st[o]);
    } else if (rd->items[o].data) {
      run.push_back({req.items[i + o].key, rd->items[o].data, req.items[i + o].size});
      run_at.push_back(o);
    } else {
      (*st)[i + o] = Status::TimedOut("the read from the client's memory ended early");
    }
  }
  put_run();
  shared_->process_store_put_ns.fetch_add(put_ns, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace adp
