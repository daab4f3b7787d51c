// SPDX-License-Identifier: Apache-2.0
// Connector: the harness LMCache's NativeConnectorL2Adapter drives.
//
// submit() queues a batch and returns its future id at once; a pool of
// worker threads runs it against a Backend, split into per-worker slices;
// completions are queued and signalled through one eventfd, and drain()
// hands them over. Every future completes exactly once: by its workers, at
// its deadline (failed), or at close() (failed). After a future completed,
// no worker writes into its buffers again, and a store that completed as
// failed is never indexed.
//
// Threading: submit/drain/close may be called from any thread. Buffer owners
// (see BufferOwner) are destroyed only inside drain() and free_retired(), so
// the Python binding can release Python buffers while holding the GIL.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "connector/backend.h"
#include "util/fork_owner.h"
#include "util/latency_histogram.h"

namespace adp {

enum class OpType { kGet, kSet, kExists, kDelete };
constexpr int kNumOpTypes = 4;
const char* op_name(OpType op);

// Keeps the memory behind a batch's buffers alive until its workers are done.
class BufferOwner {
 public:
  virtual ~BufferOwner() = default;
};

struct Buffer {
  uint8_t* data;
  size_t size;
};

struct Completion {
  uint64_t future_id;
  bool ok;
  std::string error;
  std::vector<uint8_t> per_key;  // one entry per key
};

// Where the connector's store (put) and load (get) batches spend their time,
// per worker slice (stats worker_put_* / worker_get_*, and through a gateway
// gateway_put_* / gateway_get_*; docs/stats.md). Sums in ns plus counts,
// relaxed atomics, one clock read per edge: the batch's submit, a worker
// taking a slice, its first request about to be written and its last reply read (the
// session's CallTimes), the session call returned, and the worker done with
// the slice (for the batch's last slice: its completion queued and the
// eventfd written). A slice is counted once its worker is done with it, so
// after its batch's completion was signalled: a stats read right after a
// completion may not have that batch's last slice yet.
struct OpTiming {
  std::atomic<uint64_t> slices{0};    // slices of such batches run by workers
  std::atomic<uint64_t> queue_ns{0};  // submit -> a worker took the slice
  // From when the slice could be taken (its submit, or its worker's previous
  // slice done if later; a store slice a run took late, its run's writes done
  // if later) to taken: the queue's hand-off (a worker's wake-up when it was
  // idle), not the time it waited for LMCache's next submit nor for its
  // worker's run.
  std::atomic<uint64_t> pickup_ns{0};
  std::atomic<uint64_t> run_ns{0};           // taken -> the backend call returned
  std::atomic<uint64_t> done_ns{0};          // returned -> the worker done with it (the last slice: eventfd written)
  std::atomic<uint64_t> batches{0};          // batches completed by their workers (not by the deadline or close)
  std::atomic<uint64_t> batch_ns{0};         // submit -> their last slice done (eventfd written)
  std::atomic<uint64_t> sent_slices{0};      // slices that sent a request and read its reply (a gateway)
  std::atomic<uint64_t> setup_ns{0};         // taken -> its first request about to be written
  std::atomic<uint64_t> requests{0};         // requests whose reply was read
  std::atomic<uint64_t> round_trip_ns{0};    // a request's write -> its reply read, each
  std::atomic<uint64_t> finish_ns{0};        // the slice's last reply read -> the backend call returned
  std::atomic<uint64_t> reply_spins{0};      // waits for a reply that polled (reply_spin_us: CallTimes)
  std::atomic<uint64_t> reply_spin_hits{0};  // those whose reply came while they polled
  // Stores only (worker_put_runs, worker_put_late_slices): the runs the slices took (a run of store slices
  // taken together is one backend call: on an embedded durable card, one sync), and the slices a run took once its
  // first slices were written, before its sync (run_puts, `more`).
  std::atomic<uint64_t> runs{0};
  std::atomic<uint64_t> late_slices{0};
};

struct ConnectorOptions {
  int num_workers = 4;
  int timeout_ms = 30000;
};

class Connector {
 public:
  Connector(std::unique_ptr<Backend> backend, const ConnectorOptions& opts);
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  int event_fd() const { return event_fd_; }
  uint64_t submit(OpType op, std::vector<std::string> keys, std::vector<Buffer> buffers,
                  std::unique_ptr<BufferOwner> owner);
  // Completions since the last call; consumes the eventfd.
  std::vector<Completion> drain();
  // Fails what is pending, stops the workers, closes the backend. Idempotent. Throws nothing: a pending future
  // whose completion cannot be made for want of memory is completed all the same, and its completion ("connector
  // closed") made by the next drain() (which may throw std::bad_alloc for it, the eventfd signalled again).
  void close() noexcept;
  // Destroys buffer owners of batches whose workers are done.
  void free_retired();
  StoreStats stats() const;
  // Submit-to-completion latency of the futures of one kind (timeouts included).
  LatencyHistogram::Snapshot latency(OpType op) const { return latency_[static_cast<int>(op)].snapshot(); }
  std::string describe() const { return description_; }
  // Calls f(name, value) for each per-request timing stat (OpTiming):
  // worker_{put,get}_*, and with `gateway` gateway_{put,get}_* too.
  template <typename F>
  void for_each_timing(bool gateway, F&& f) const;
  // In a process forked from the one that made it (debt39): its card, its parent's view of it (index, frontier) and
  // its gateway connections are the parent's, its threads are not here. There submit() completes each batch at once
  // (puts and deletes failed, gets and lookups all misses) and touches neither the backend nor mu_ (a parent's thread
  // may have held it at the fork), with one ERROR line naming the parent; drain() hands those over, close() only
  // marks it closed, and ~Connector leaves the threads and the backend as they are (a joinable std::thread destroyed
  // ends the process; the backend's close would write to the card or on the parent's connections).
  // Its futures pending at the fork (submitted by the parent, not drained there) are the child's too (fork40): fork()'s
  // handlers (pthread_atfork, registered with the first connector) take mu_ before the fork, so the child sees them
  // whole, and the child's handler hands them to the child's drain() at once: those done at the fork as they were
  // done, the others as the child's own submit() completes them (puts and deletes failed, gets and lookups all
  // misses); the child's eventfd is made and signalled there. Nothing added to a call in the parent.
  bool inherited() const { return owner_.inherited(); }

 private:
  struct Batch;
  struct Task {
    Batch* batch;
    size_t begin, end;
  };
  using Clock = std::chrono::steady_clock;

  void worker_loop(int index, bool second);
  void deadline_loop();
  // The deadline thread out of memory (its `tries`-th failure in a row; the first logged at ERROR): mu_ released
  // for a pause (1 ms doubling to 100 ms), then taken again.
  void deadline_pause(std::unique_lock<std::mutex>& lock, int tries) noexcept;
  void run_task(BackendSession& session, const Task& t);
  // Store slices taken together (take_puts_locked): one put_slices() call. With `cap` (put_slices_bytes), the
  // session may ask for the slices queued by the time the run's writes are done (take_puts_locked, `more`): they
  // are appended to `run`, written before the run's one sync and completed with it.
  // *late_taken: when those were taken (their queue and pickup end there, not at the run's take); *late_ready: when
  // the session asked for them, its writes done (their pickup counts from there, or from their submit if later: a
  // slice can be taken late no sooner; debt37, until then it counted from the worker's previous run done, the
  // run's write phase in it).
  void run_puts(BackendSession& session, std::vector<Task>& run, uint64_t cap, Clock::time_point* late_taken,
                Clock::time_point* late_ready);
  // Records a store slice's results in its batch.
  void put_results(const Task& t, const Status* st);
  // Appends to `run` (one store slice) the store slices queued next, while
  // their bytes stay within `cap` and they are at most this worker's share
  // of the queue (it and this one over all the workers: a busy worker that
  // comes back finds its share, and no worker idles behind another's
  // slices). With `more`, a run already written and not yet synced
  // (run_puts): at most its share of the queue (the queue over all the
  // workers) is appended, its bytes and the run's within `cap`. Caller holds
  // mu_.
  void take_puts_locked(uint64_t cap, std::vector<Task>* run, bool more = false);
  // A slice's times: its batch's submit, its worker's previous slice done,
  // taken, the backend call returned, the slice done (task_done).
  // free_since: the worker's previous slice done (a store slice a run took late: its run's writes done); the pickup
  // counts from it or from the submit, whichever is later.
  struct SliceTimes {
    Clock::time_point submitted, free_since, taken, ran, done;
  };
  // Adds a get or put slice's times to m; `session`'s CallTimes too if given.
  static void note_timing(OpTiming& m, const SliceTimes& at, bool completed, const BackendSession* session);
  // The eventfd write for completions queued under mu_, made once mu_ is released: declared before the lock it
  // follows, so destroyed after it. Session 36 (convoy36): commit_locked wrote the eventfd holding mu_, and the
  // driver it woke went straight for mu_ in drain(), a futex wait and wake on every completion (tmpfs loads'
  // `done` 30-55 us of a 256 KiB slice on the 2-core VM). No wake-up is lost by writing later: the completion
  // is in completions_ before mu_ is released, so the write comes after it, and a drain() woken by the write
  // takes mu_ after the write, so finds it (or an earlier drain() took it and this one finds nothing). Each
  // completion has a write after it (two workers completing at once: two writes; close(): one for all it
  // completes under one hold of mu_). ~Connector closes the eventfd after close() joined every writer.
  class Signal {
   public:
    explicit Signal(const Connector& c) noexcept : c_(c) {}
    ~Signal() {
      if (due_) c_.signal();
    }
    Signal(const Signal&) = delete;
    Signal& operator=(const Signal&) = delete;
    void set() noexcept { due_ = true; }

   private:
    const Connector& c_;
    bool due_ = false;
  };
  void signal() const noexcept;  // the eventfd written (a waiter polling it drains); called without mu_
  // Completes b (once), waiting for a delivery in flight, and queues its completion; caller holds mu_, `sig`
  // declared before its lock. Returns whether this call completed it. A std::bad_alloc out of it leaves b as it
  // was.
  bool complete_locked(Batch* b, bool ok, const std::string& error, bool use_results, Signal& sig);
  // A completion in two steps: made (and room for it queued: what allocates, so may throw std::bad_alloc, nothing
  // changed), then queued (nothing that throws) and its eventfd write left to `sig`, made once the caller has
  // released mu_. Caller holds mu_.
  Completion make_completion_locked(Batch* b, bool ok, const std::string& error, bool use_results);
  void commit_locked(Batch* b, Completion&& c, bool use_results, Signal& sig) noexcept;
  void retire_locked(Batch* b);  // moves b from live_ to retired_ (its last task is done; room in retired_)
  // Whether it completed b (its last slice, before the deadline or close). A std::bad_alloc out of it leaves b as
  // it was (its slice not counted done).
  bool task_done(Batch* b);
  // task_done, tried again after a pause while it throws (worker `index`'s: a future must complete).
  bool finish_task(int index, Batch* b) noexcept;
  // A worker's slices `run` that an exception `e` (null: not a std::exception) ended: each batch fails with the
  // reason, logged once at ERROR (session 26: the worker goes on).
  void fail_slices(int index, const std::vector<Task>& run, const std::exception* e) noexcept;
  // The worker's session (a new one after an exception: the old one's connection may be mid-request), or null
  // with the reason logged and written into why (why_size bytes, cut to fit; no allocation): its batches fail
  // with it, and the next one tries again.
  std::unique_ptr<BackendSession> open_session(int index, char* why, size_t why_size) noexcept;
  // The workers and the deadline thread, at construction; one that cannot be started stops those that were and
  // throws std::runtime_error with the reason.
  void start_threads();
  // Sets closed_, completes what is pending as failed and joins the threads; false if closed_ was set already. A
  // batch whose guard a worker holds is completed after the join, never waited for under mu_ (review33b F1).
  bool stop_threads();
  // close()'s failure of pending b without memory for its completion: b (marked completed by the caller) has its
  // deadline dropped, is queued on lost_ (an extra task keeps it from retirement), the eventfd signalled by `sig`
  // once mu_ is released. Caller holds mu_.
  void lose_completion_locked(Batch* b, Signal& sig) noexcept;
  // Makes the completions of lost_'s batches ("connector closed", failed) and retires those whose workers are done.
  // A std::bad_alloc leaves the rest on lost_. Caller holds mu_.
  void collect_lost_locked();
  // submit() and drain() in a forked child (inherited()), and their first call's work there: the ERROR line (and
  // inherited_setup_locked, where no fork handler of the connectors ran). Under inherited_mu_.
  void inherited_first_locked();
  // A forked child's own eventfd on the inherited number (signalled where inherited_done_ holds completions) and its
  // future ids; `forks`: this process's fork_count(). Under inherited_mu_ (or in the fork's child handler).
  void inherited_setup_locked(uint64_t forks) noexcept;
  // The error of a put or delete refused in a forked child.
  std::string inherited_error() const;
  // fork()'s handlers over every connector of the process (fork40; the list: enlist/delist, the constructor and the
  // destructor). prepare takes each one's mu_ (inherited_mu_ for one inherited already), so that no thread of the
  // parent holds it at the fork; parent gives them back; child gives them back after forked_child().
  void enlist();
  void delist() noexcept;
  static void fork_prepare() noexcept;
  static void fork_parent() noexcept;
  static void fork_child() noexcept;
  // In the child of a fork, with the lock fork_prepare took held: the parent's futures not drained at the fork handed
  // to the child's drain(), its eventfd made (inherited_setup_locked).
  void forked_child() noexcept;
  uint64_t refuse_inherited(OpType op, size_t n, std::unique_ptr<BufferOwner> owner);
  std::vector<Completion> drain_inherited();

  const ForkOwner owner_;
  // A forked child's state (inherited()), under inherited_mu_: never taken in the process that made it.
  std::mutex inherited_mu_;
  // fork_count() of the process that made its own eventfd and future ids (inherited_setup_locked; 0: none yet). A
  // count, not a flag: a child forked from such a child copies it, and makes its own (review39).
  uint64_t inherited_forks_ = 0;
  uint64_t inherited_said_ = 0;       // fork_count() of the process that logged the ERROR line (0: none yet)
  bool fork_took_inherited_ = false;  // fork_prepare took inherited_mu_ (not mu_): set and read by the forking thread
  uint64_t inherited_next_ = 0;
  std::vector<Completion> inherited_done_;
  std::vector<std::unique_ptr<BufferOwner>> inherited_owners_;  // freed by drain(), the caller's thread

  mutable std::shared_mutex backend_mu_;  // close() drops the backend while submit() may use it
  std::unique_ptr<Backend> backend_;
  const std::string description_;
  const ConnectorOptions opts_;
  int event_fd_ = -1;

  mutable std::mutex mu_;
  std::condition_variable work_cv_, deadline_cv_;
  std::deque<Task> tasks_;
  std::multimap<Clock::time_point, Batch*> deadlines_;
  std::map<uint64_t, std::unique_ptr<Batch>> live_;  // submitted, workers not yet done
  std::vector<std::unique_ptr<Batch>> retired_;      // workers done; owners to free
  // Tests only (ADP_TEST_DELIVERY_DELAY_MS): a pause inside each load's
  // delivery, under the batch's guard, as a slow read into the buffer would be.
  std::chrono::milliseconds test_delivery_delay_{0};
  std::vector<Completion> completions_;
  Batch* lost_ = nullptr;  // closed without memory for their completions (lose_completion_locked), drain() makes them
  uint64_t next_future_ = 1;
  bool closed_ = false;
  std::vector<std::thread> workers_;
  // A worker of a backend that overlaps_store_syncs() is two threads (workers_ holds both) that take turns writing
  // (session 36, brief behind36): the one holding its lane's turn takes the next run from the queue and keeps the
  // turn until a store run's writes are done and its sync begins (BackendSession::written_hook; a run that makes
  // no sync, a load, keeps it: no hand-off between the threads for it); the other then takes the next run and writes it
  // while that sync (and the commit, and the completions) go on. So a worker writes one run at a time, as one thread
  // would, and has at most two runs in flight: one written, its sync pending, and one being written (or syncing too).
  // Each thread syncs, commits and completes its own runs through the store's put path as before (CardStore::put_each:
  // GroupSync's rules, the ticket wait, the pins): the "committer" of a run is the thread that wrote it, no longer
  // holding the writing turn. Made before the threads; null for other backends (one thread a worker, no turn).
  struct Lane {
    std::mutex mu;
    std::condition_variable cv;
    bool writing = false;  // a thread of the lane holds the turn
  };
  std::unique_ptr<Lane[]> lanes_;
  std::thread deadline_thread_;
  LatencyHistogram latency_[kNumOpTypes];
  OpTiming put_timing_, get_timing_;
  // Keys of the lookups whose answer reached LMCache (a successful exists
  // future): found / not found (StoreStats::lookup_hits / lookup_misses).
  std::atomic<uint64_t> lookup_hits_{0}, lookup_misses_{0};
};

template <typename F>
void Connector::for_each_timing(bool gateway, F&& f) const {
  auto load = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  for (const auto& [op, t] : {std::pair<const char*, const OpTiming*>{"put", &put_timing_}, {"get", &get_timing_}}) {
    const std::string w = std::string("worker_") + op, g = std::string("gateway_") + op;
    f(w + "_slices", load(t->slices));
    f(w + "_queue_ns", load(t->queue_ns));
    f(w + "_pickup_ns", load(t->pickup_ns));
    f(w + "_run_ns", load(t->run_ns));
    f(w + "_done_ns", load(t->done_ns));
    f(w + "_batches", load(t->batches));
    f(w + "_batch_ns", load(t->batch_ns));
    if (t == &put_timing_) {
      f(w + "_runs", load(t->runs));
      f(w + "_late_slices", load(t->late_slices));
    }
    if (!gateway) continue;
    f(g + "_slices", load(t->sent_slices));
    f(g + "_setup_ns", load(t->setup_ns));
    f(g + "_requests", load(t->requests));
    f(g + "_round_trip_ns", load(t->round_trip_ns));
    f(g + "_finish_ns", load(t->finish_ns));
    f(g + "_reply_spins", load(t->reply_spins));
    f(g + "_reply_spin_hits", load(t->reply_spin_hits));
  }
}

}  // namespace adp
