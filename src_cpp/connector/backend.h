// SPDX-License-Identifier: Apache-2.0
// Backend: where the connector's work goes. One implementation per transport:
// the embedded card store (transport/embedded_backend), or a gateway reached
// over a socket. The connector creates one Session per worker thread; a
// Session is used by that thread only, and its calls block until done.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/store_types.h"
#include "util/status.h"

namespace adp {

// Delivers the `size` bytes of key i into the caller's buffer by calling
// copy(dst) (which may check them while copying). Returns false when the
// caller no longer accepts them (deadline passed, wrong length) or copy()
// failed; the key then counts as a miss.
using DeliverFn = std::function<bool(size_t i, size_t size, const CopyFn& copy)>;

// The batch's deadline: a session that waits on I/O (a gateway) gives up by
// then; past it the connector has already completed the future as failed.
using Deadline = std::chrono::steady_clock::time_point;

// Runs read() under the batch's guard (the one deliveries of a load hold),
// and only while its future has not completed: a put reads the caller's
// buffers only inside read(), so no byte is read after LMCache may have
// reused them. Returns false, without running read(), once completed.
// guarded([] {}) tells whether the store is still wanted.
using GuardedReadFn = std::function<bool(const std::function<void()>& read)>;

// When a session call's requests went to its peer and its replies came
// back (a gateway's session fills it; an embedded one leaves it zero): the
// connector zeroes it before each put() or get() and adds it to its
// per-request timing after (Connector::timing, stats gateway_put_* and
// gateway_get_*). One clock read per edge.
struct CallTimes {
  // Its first request about to be written (epoch: none was). Read before the
  // write: the gateway may read the request before the client's send()
  // returns (a wake-up preempts the sender), so the write counts in the round trip.
  std::chrono::steady_clock::time_point first_sent{};
  std::chrono::steady_clock::time_point last_reply{};  // its last reply read (epoch: none was)
  uint64_t requests = 0;                               // requests whose reply was read
  uint64_t round_trip_ns = 0;                          // their request's write -> its reply read, summed
  // reply_spin_us: waits for a reply that polled without sleeping (slept to
  // shortly before the round trip expected, the reply not there by then),
  // and those whose reply came while it polled.
  uint64_t reply_spins = 0, reply_spin_hits = 0;
  // A request was written (t: before its write) / its reply just read (t: now).
  void sent(std::chrono::steady_clock::time_point t) {
    if (first_sent == std::chrono::steady_clock::time_point{}) first_sent = t;
    sent_at_ = t;
  }
  void replied(std::chrono::steady_clock::time_point t) {
    last_reply = t;
    requests++;
    round_trip_ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t - sent_at_).count());
  }

 private:
  std::chrono::steady_clock::time_point sent_at_{};
};

class BackendSession {
 public:
  virtual ~BackendSession() = default;
  // The current put()'s or get()'s requests and replies (CallTimes); the
  // connector's worker resets and reads it around each call.
  CallTimes times;
  // results[i] for each item; objects are indexed only if the store is still
  // wanted (guarded([] {})) once their bytes are on the card. A session that
  // copies the caller's bytes before storing them (a gateway's) copies them
  // inside guarded().
  virtual void put(const PutItem* items, size_t n, Status* results, Deadline deadline,
                   const GuardedReadFn& guarded) = 0;
  // One batch's slice, for put_slices().
  struct PutSlice {
    const PutItem* items;
    size_t n;
    Status* results;
    Deadline deadline;
    const GuardedReadFn* guarded;
  };
  // Called by a session of a backend that overlaps_store_syncs() once a store's writes are done and every store
  // reserved before them resolved, as its sync begins (possibly more than once a call): set by the connector once a
  // session (never per operation); empty: nothing called.
  std::function<void()> written_hook;
  // Up to how many bytes of store slices (of batches queued behind one
  // another) a worker hands to one put_slices(); 0: one slice a call.
  virtual uint64_t put_slices_bytes() const { return 0; }
  // More store slices for a put_slices() call, asked by a session that shares its sync between slices once the
  // call's own are written and before that sync (the connector takes those queued meanwhile, within its bounds).
  // Returns how many, *slices pointing at them (valid until put_slices returns); each slice's results are set
  // (the session stores them as the call's own, one sync for all). 0: none.
  using MoreSlicesFn = std::function<size_t(const PutSlice** slices)>;
  // Stores several slices, each as put() would; a session may share work
  // between them (an embedded durable card: all written, one sync, then each
  // slice's objects indexed if its guarded() still lets them), and may ask
  // `more` (if given) once for slices to write before that sync.
  virtual void put_slices(const PutSlice* slices, size_t count, const MoreSlicesFn* more) {
    (void)more;  // a session that shares nothing takes no more
    for (size_t s = 0; s < count; s++)
      put(slices[s].items, slices[s].n, slices[s].results, slices[s].deadline, *slices[s].guarded);
  }
  // results[i]: Ok (delivered), NotFound (miss) or an error. sizes[i] is
  // the length of the caller's buffer for key i (a gateway reserves room
  // for it; deliver() still decides). dsts[i] is that buffer: a session may
  // let a peer write into it directly (a gateway mapping the caller's
  // shared memory) only from inside guarded(), and must have stopped the
  // peer before guarded's read() returns; otherwise bytes go through
  // deliver().
  virtual void get(const std::string_view* keys, const size_t* sizes, uint8_t* const* dsts, size_t n, Status* results,
                   Deadline deadline, const DeliverFn& deliver, const GuardedReadFn& guarded) = 0;
  // results[i]: Ok (present), NotFound (absent) or why it could not be
  // answered (a gateway that failed or answered an error).
  virtual void exists(const std::string_view* keys, size_t n, Status* results, Deadline deadline) = 0;
  // results[i]: Ok (deleted), NotFound (was not there) or why the delete did
  // not happen (an I/O error, a gateway that failed or answered an error).
  virtual void remove(const std::string_view* keys, size_t n, Status* results, Deadline deadline) = 0;
  // Called once, by the connector's first worker as it starts, before it
  // takes any work: a session whose peer is reached over a socket connects
  // now (a gateway: connect and handshake, a failure logged and counted as a
  // batch's would be), so that stats() says whether the peer can be reached
  // before the first batch (audit 13 item 6). It returns at once: the connect
  // runs on a thread of its own, so neither start nor a batch waits behind
  // it (RemoteSession::take_start: the first batch uses that connection, or
  // connects on its own after kStartWait). A no-op by default.
  virtual void prepare() {}
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::unique_ptr<BackendSession> new_session() = 0;
  // Answers exists() at once, from memory, if this backend can (the embedded
  // index can; a socket cannot). Returns false to have the workers do it.
  virtual bool exists_now(const std::string* keys, size_t n, uint8_t* found) {
    (void)keys, (void)n, (void)found;
    return false;
  }
  // One line for logs and status: which card or gateway this is.
  virtual std::string describe() const = 0;
  virtual StoreStats stats() const = 0;
  // True where a store's sync is worth overlapping with the next store's writes (an embedded durable disk card:
  // the connector then runs each worker as two threads that take turns writing, and a session calls its
  // written_hook once a store's writes are done and its sync begins: Connector::worker_loop).
  virtual bool overlaps_store_syncs() const { return false; }
  // Makes session calls blocked on I/O return soon (as failed). Called by
  // Connector::close() before it joins its workers; a no-op for backends
  // that never block on a peer.
  virtual void interrupt() {}
};

}  // namespace adp
