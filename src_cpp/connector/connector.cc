// SPDX-License-Identifier: Apache-2.0
#include "connector/connector.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <thread>

#include "protocol/frame.h"
#include "store/card_store.h"
#include "util/clip.h"
#include "util/log.h"
#include "util/piece_pool.h"
#include "util/test_hooks.h"
#include "util/thread_name.h"

namespace adp {

struct Connector::Batch {
  uint64_t id = 0;
  OpType op = OpType::kGet;
  std::vector<std::string> keys;
  std::vector<Buffer> buffers;
  std::unique_ptr<BufferOwner> owner;
  Clock::time_point submitted;
  std::vector<uint8_t> results;  // per key; each worker writes only its slice
  Clock::time_point deadline;
  std::multimap<Clock::time_point, Batch*>::iterator deadline_it;
  int tasks_left = 0;  // guarded by Connector::mu_
  std::mutex error_mu;
  std::string first_error;  // guarded by error_mu
  // Guarded by error_mu: the first error where first_error could not be made (no memory), cut to fit. Session 30:
  // such a batch completed "the connector failed this batch (no memory for the reason)", where the reason was
  // known (most often the want of memory itself, made in a buffer by fail_slices); kept here with no allocation.
  char error_text[160] = {};
  // Deliveries into caller buffers hold it shared; completion takes it
  // exclusive, so once `completed` is set no delivery is in flight or starts.
  std::shared_mutex guard;
  bool completed = false;  // guarded by guard
  // Completed by close() without memory for its completion (Connector::lost_, guarded by Connector::mu_): the
  // next one of them; drain() makes its completion ("connector closed").
  Batch* lost_next = nullptr;
  // Its deadline (or close()) came while a worker held its guard (review33b F1: a load into registered memory
  // whose stopped gateway holds the WRITING lease; a hung card read into its buffer): no new read into its
  // buffers starts (guarded_read, deliver), so the guard is let go after the one in flight. Set by the deadline
  // thread and close(), read by workers.
  std::atomic<bool> overdue{false};
  int held_tries = 0;          // guarded by Connector::mu_: the deadline thread's looks at a held guard
  Batch* held_next = nullptr;  // guarded by Connector::mu_: close()'s list of batches held (stop_threads)

  // Never throws and allocates only for first_error: a failure whose text cannot be kept there (no memory for it)
  // is kept in error_text.
  void note_error(std::string_view e) noexcept {
    std::lock_guard<std::mutex> l(error_mu);
    if (!first_error.empty() || error_text[0]) return;
    try {
      first_error.assign(e);
    } catch (...) {
      std::snprintf(error_text, sizeof error_text, "%.*s", static_cast<int>(e.size()), e.data());
    }
  }
  // The batch's error, "" if none (may throw std::bad_alloc: nothing changed then).
  std::string error() {
    std::lock_guard<std::mutex> l(error_mu);
    return first_error.empty() ? std::string(error_text) : first_error;
  }
  // Whether its slices are past running: completed, or overdue (a slice of it still queued when its deadline or
  // close() found another slice's read holding the guard is not started).
  bool is_completed() {
    std::shared_lock<std::shared_mutex> l(guard);
    return !takes_reads();
  }
  // Sets `completed`, after any delivery in flight has finished; false if it
  // was already set.
  bool mark_completed() {
    std::unique_lock<std::shared_mutex> g(guard);
    if (completed) return false;
    completed = true;
    return true;
  }
  // mark_completed without waiting: kHeld while a worker holds the guard (a read into its buffers in flight;
  // `overdue` is set so that no other starts), the batch left pending. Never blocks, so it is called under
  // Connector::mu_: one held guard must hold back no other future (review33b F1).
  enum class Mark { kMarked, kAlready, kHeld };
  Mark try_mark_completed() noexcept {
    std::unique_lock<std::shared_mutex> g(guard, std::try_to_lock);
    if (!g.owns_lock()) {
      overdue.store(true, std::memory_order_release);
      return Mark::kHeld;
    }
    if (completed) return Mark::kAlready;
    completed = true;
    return Mark::kMarked;
  }
  // Whether a read into its buffers may start; caller holds the guard (shared).
  bool takes_reads() const noexcept { return !completed && !overdue.load(std::memory_order_acquire); }
};

const char* op_name(OpType op) {
  switch (op) {
    case OpType::kGet:
      return "get";
    case OpType::kSet:
      return "set";
    case OpType::kExists:
      return "exists";
    case OpType::kDelete:
      return "delete";
  }
  return "?";
}

Connector::Connector(std::unique_ptr<Backend> backend, const ConnectorOptions& opts)
    : backend_(std::move(backend)), description_(backend_->describe()), opts_(opts) {
  // The test hooks, read once here (and by a RemoteBackend, at its construction); each one set is logged.
  const TestHooks hooks = read_test_hooks();
  warn_test_hooks(hooks, HookSide::kConnector);
  apply_failing_hold(hooks);  // its card's (embedded) or its gateway's card's health hold
  test_delivery_delay_ = std::chrono::milliseconds(hooks.delivery_delay_ms);
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) throw std::runtime_error("eventfd failed: " + errno_text(errno));
  // The CPUs its spin rule counts (reply_spin_us; a container's quota taken), as the gateway's start line says.
  // Made before the threads start: nothing after them may throw (a joinable thread destroyed in the unwinding).
  const std::string cpus = PiecePool::usable_cpus_text(hooks.cpu_max_file);
  enlist();  // may throw (std::bad_alloc): nothing started yet
  try {
    start_threads();
  } catch (...) {
    delist();
    throw;
  }
  ADP_INFO("ADPConnector ready: %s, %d workers, timeout %d ms, %s", description_.c_str(), opts_.num_workers,
           opts_.timeout_ms, cpus.c_str());
}

void Connector::start_threads() {
  // Each of them is needed: a worker runs the batches (the connector asked for num_workers of them; fewer would
  // serve them all, slower than asked, with nothing to show it), the deadline thread ends a batch at its timeout
  // (without it a future whose gateway never answers would never complete). One that cannot be started
  // (std::system_error: a pids limit, memory for its stack; std::bad_alloc: its state, or workers_' storage) fails
  // the construction with the reason: those started are stopped and joined first, where the exception ended the
  // process (a joinable std::thread destroyed in the unwinding: std::terminate).
  // An embedded durable disk card: two threads a worker, taking turns writing (lanes_: the sync off the writer's
  // path). The second of each is started after every worker's first.
  const int workers = std::max(0, opts_.num_workers);
  int started = 0, threads = workers;
  try {
    if (workers && backend_->overlaps_store_syncs()) {
      lanes_ = std::make_unique<Lane[]>(static_cast<size_t>(workers));
      threads = 2 * workers;
    }
    workers_.reserve(static_cast<size_t>(threads));
    for (; started < threads; started++)
      workers_.emplace_back(&Connector::worker_loop, this, started % std::max(1, workers), started >= workers);
    deadline_thread_ = std::thread(&Connector::deadline_loop, this);
  } catch (const std::exception& e) {
    stop_threads();
    ::close(event_fd_);
    event_fd_ = -1;
    const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    const std::string which = started < threads
                                  ? "worker thread " + std::to_string(started + 1) + " of " + std::to_string(threads)
                                  : std::string("deadline thread");
    throw std::runtime_error("ADPConnector: cannot start its " + which + " (" +
                             (memory ? std::string("out of memory: std::bad_alloc") : std::string(e.what())) + ")");
  }
}

namespace {
// A pending future's error at close() (16 characters: a std::string of it allocates).
constexpr const char* kClosedError = "connector closed";
}  // namespace

bool Connector::stop_threads() {
  Batch* held = nullptr;  // pending batches whose guard a worker holds: completed once the workers are joined
  {
    Signal sig(*this);  // one write for all of them, after the lock
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    closed_ = true;
    // Workers blocked on a gateway return first: one holding its batch's
    // guard for a load into registered memory lets go of it only then.
    backend_->interrupt();
    // Everything still pending completes now, as failed; one whose completion cannot be made (no memory: close()
    // and ~Connector throw nothing) is completed all the same and its completion made by the next drain()
    // (session 28: a std::bad_alloc here ended the process, std::terminate from ~Connector). One whose guard a
    // worker holds is not waited for here, under mu_: a drain() meanwhile (the binding calls it with the GIL
    // held) would block with it, for as long as a stopped gateway holds its lease (review33b F1). It keeps an
    // extra task (not retired under us) and completes below, once its worker has returned.
    while (!deadlines_.empty()) {
      Batch* b = deadlines_.begin()->second;
      Completion c;
      bool made = true;
      try {
        c = make_completion_locked(b, false, kClosedError, false);
      } catch (...) {
        made = false;
      }
      switch (b->try_mark_completed()) {
        case Batch::Mark::kMarked:
          if (made) {
            commit_locked(b, std::move(c), false, sig);
          } else {
            lose_completion_locked(b, sig);
          }
          break;
        case Batch::Mark::kAlready:  // not met: a batch is completed and its deadline dropped under mu_ together
          deadlines_.erase(b->deadline_it);
          b->deadline_it = deadlines_.end();
          break;
        case Batch::Mark::kHeld:
          deadlines_.erase(b->deadline_it);
          b->deadline_it = deadlines_.end();
          b->tasks_left++;
          b->held_next = held;
          held = b;
          break;
      }
    }
  }
  work_cv_.notify_all();
  deadline_cv_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
  if (deadline_thread_.joinable()) deadline_thread_.join();
  // The workers are joined: no read into a held batch's buffers is in flight, so marking it waits for nothing.
  // Its worker's task_done found the extra task and left the batch pending for this.
  while (held) {
    Batch* b = held;
    held = b->held_next;
    b->held_next = nullptr;
    Signal sig(*this);
    std::lock_guard<std::mutex> lock(mu_);
    Completion c;
    bool made = true;
    try {
      c = make_completion_locked(b, false, kClosedError, false);
      retired_.reserve(retired_.size() + 1);
    } catch (...) {
      made = false;
    }
    if (b->mark_completed()) {
      if (made) {
        commit_locked(b, std::move(c), false, sig);
      } else {
        lose_completion_locked(b, sig);  // its own extra task: the decrement below does not retire it
      }
    }
    // Marked here (its worker's task_done only counted its slice: the extra task was there), so tasks_left is 0
    // only where made, whose room is reserved.
    if (--b->tasks_left == 0) retire_locked(b);
  }
  return true;
}

void Connector::lose_completion_locked(Batch* b, Signal& sig) noexcept {
  if (b->deadline_it != deadlines_.end()) deadlines_.erase(b->deadline_it);
  b->deadline_it = deadlines_.end();
  // Completed (by the caller) from here: no worker writes into its buffers, a store of it is never indexed. Its
  // slices' task_done find it completed; the extra task keeps it from their retirement until drain() made its
  // completion.
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - b->submitted).count();
  latency_[static_cast<int>(b->op)].record(static_cast<uint64_t>(us));
  b->tasks_left++;
  b->lost_next = lost_;
  lost_ = b;
  sig.set();  // a waiter polling the eventfd drains it
}

void Connector::collect_lost_locked() {
  while (lost_) {
    Batch* b = lost_;
    // What allocates first: a std::bad_alloc leaves b on lost_ for the next drain().
    Completion c{b->id, false, kClosedError, std::vector<uint8_t>(b->keys.size(), 0)};
    completions_.reserve(completions_.size() + 1);
    retired_.reserve(retired_.size() + 1);
    completions_.push_back(std::move(c));
    lost_ = b->lost_next;
    b->lost_next = nullptr;
    if (--b->tasks_left == 0) retire_locked(b);
  }
}

Connector::~Connector() {
  delist();  // first: a fork from now on does not see it
  if (inherited()) {
    // A forked child's (see inherited()): the parent's threads are not here, and the backend's close would write to
    // the card or on the parent's connections. Both left as they are (leaked), the eventfd is this process's. The
    // binding never destroys one there (it leaks it whole): a condition variable a parent's thread waited on at the
    // fork is waited out for ever by its destructor (glibc counts its waiters).
    static_cast<void>(new std::vector<std::thread>(std::move(workers_)));
    static_cast<void>(new std::thread(std::move(deadline_thread_)));
    static_cast<void>(backend_.release());
    if (event_fd_ >= 0) ::close(event_fd_);
    return;
  }
  close();
  free_retired();
  if (event_fd_ >= 0) ::close(event_fd_);
}

uint64_t Connector::submit(OpType op, std::vector<std::string> keys, std::vector<Buffer> buffers,
                           std::unique_ptr<BufferOwner> owner) {
  if (inherited()) return refuse_inherited(op, keys.size(), std::move(owner));
  auto b = std::make_unique<Batch>();
  b->op = op;
  b->keys = std::move(keys);
  b->buffers = std::move(buffers);
  b->owner = std::move(owner);
  b->results.assign(b->keys.size(), 0);
  b->submitted = Clock::now();
  b->deadline = b->submitted + std::chrono::milliseconds(opts_.timeout_ms);
  size_t n = b->keys.size();
  // Exists is index work only: one task. The rest spread over the workers
  // (counted from opts_: close() may be clearing workers_ concurrently).
  size_t slices = (op == OpType::kExists || n == 0) ? 1 : std::min<size_t>(n, opts_.num_workers);

  // A lookup the backend answers from memory completes here: no worker
  // hand-off on the path LMCache's lookup-and-lock waits on.
  bool answered = false;
  if (op == OpType::kExists && n > 0) {
    std::shared_lock<std::shared_mutex> bl(backend_mu_);
    answered = backend_ && backend_->exists_now(b->keys.data(), n, b->results.data());
  }

  // What allocates comes before anything of the batch is registered: a std::bad_alloc (Python: MemoryError) refuses
  // the batch, which is freed here (its owner too, mu_ released first), its buffers never written, nothing of it
  // kept (session 29: after close() one stayed in live_ and deadlines_ until ~Connector, its completion never
  // made).
  Signal sig(*this);  // after the lock (below): a batch completed here is signalled once mu_ is released
  std::lock_guard<std::mutex> lock(mu_);
  Batch* raw = b.get();
  raw->id = next_future_++;
  raw->deadline_it = deadlines_.end();
  if (closed_ || n == 0 || answered) {
    // Completed here, never live: room for it in retired_, then its completion made (what throws), then queued.
    raw->tasks_left = 1;
    retired_.reserve(retired_.size() + 1);
    complete_locked(raw, !closed_, closed_ ? "connector is closed" : "", answered && !closed_, sig);
    raw->tasks_left = 0;
    const uint64_t id = raw->id;
    retired_.push_back(std::move(b));
    return id;
  }
  const auto live = live_.emplace(raw->id, nullptr).first;
  try {
    raw->deadline_it = deadlines_.emplace(raw->deadline, raw);
    for (size_t s = 0; s < slices; s++) tasks_.push_back({raw, n * s / slices, n * (s + 1) / slices});
  } catch (...) {
    while (!tasks_.empty() && tasks_.back().batch == raw) tasks_.pop_back();
    if (raw->deadline_it != deadlines_.end()) deadlines_.erase(raw->deadline_it);
    live_.erase(live);
    throw;
  }
  live->second = std::move(b);
  raw->tasks_left = static_cast<int>(slices);
  work_cv_.notify_all();
  if (raw->deadline_it == deadlines_.begin()) deadline_cv_.notify_one();
  return raw->id;
}

bool Connector::complete_locked(Batch* b, bool ok, const std::string& error, bool use_results, Signal& sig) {
  Completion c = make_completion_locked(b, ok, error, use_results);  // what allocates first: nothing changed on a throw
  if (!b->mark_completed()) return false;
  commit_locked(b, std::move(c), use_results, sig);
  return true;
}

Completion Connector::make_completion_locked(Batch* b, bool ok, const std::string& error, bool use_results) {
  Completion c{b->id, ok, error, {}};
  c.per_key = use_results ? b->results : std::vector<uint8_t>(b->keys.size(), 0);
  completions_.reserve(completions_.size() + 1);  // commit_locked's push_back allocates nothing
  return c;
}

void Connector::signal() const noexcept {
  uint64_t one = 1;
  ssize_t w = ::write(event_fd_, &one, sizeof one);
  (void)w;  // the counter cannot overflow in practice; a full counter still reads as readable
}

void Connector::commit_locked(Batch* b, Completion&& c, bool use_results, Signal& sig) noexcept {
  if (b->deadline_it != deadlines_.end()) deadlines_.erase(b->deadline_it);
  b->deadline_it = deadlines_.end();
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - b->submitted).count();
  latency_[static_cast<int>(b->op)].record(static_cast<uint64_t>(us));
  const bool ok = c.ok;
  if (b->op == OpType::kExists && ok && use_results) {
    // The answer LMCache gets, once per key (a failed or timed-out lookup: in neither; LMCache reads it all misses).
    const auto found = static_cast<uint64_t>(std::count(c.per_key.begin(), c.per_key.end(), uint8_t{1}));
    lookup_hits_.fetch_add(found, std::memory_order_relaxed);
    lookup_misses_.fetch_add(c.per_key.size() - found, std::memory_order_relaxed);
  }
  completions_.push_back(std::move(c));  // room reserved by make_completion_locked: allocates nothing
  sig.set();
}

bool Connector::task_done(Batch* b) {
  Signal sig(*this);  // written after the lock below is released: the driver woken by it finds mu_ free
  std::lock_guard<std::mutex> lock(mu_);
  if (b->tasks_left > 1) {
    b->tasks_left--;
    return false;
  }
  // Its last slice: what allocates comes first (a std::bad_alloc leaves the batch as it was, for the worker to
  // try again: finish_task), then nothing that throws.
  // Overdue: its deadline passed while a read held its guard, so it completes as the deadline thread would have
  // (failed, timed out), not with what its worker made of the reads it was let do.
  const bool overdue = b->overdue.load(std::memory_order_acquire);
  const std::string err = overdue ? "timed out after " + std::to_string(opts_.timeout_ms) + " ms" : b->error();
  Completion c = make_completion_locked(b, err.empty(), err, !overdue);
  retired_.reserve(retired_.size() + 1);
  b->tasks_left = 0;
  const bool completed = b->mark_completed();  // false: the deadline or close() completed it
  if (completed) commit_locked(b, std::move(c), !overdue, sig);
  retire_locked(b);
  return completed;
}

bool Connector::finish_task(int index, Batch* b) noexcept {
  for (int tries = 0;; tries++) {
    try {
      return task_done(b);
    } catch (...) {
      // Out of memory for the completion: the batch is as it was; tried again after a pause (the future must
      // complete, and its slice be counted, or its buffers would never be given back).
      if (tries == 0) {
        try {
          ADP_ERROR("ADPConnector: worker %d has no memory to complete a batch (std::bad_alloc): trying again", index);
        } catch (...) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, 1 << std::min(tries, 7))));
    }
  }
}

void Connector::retire_locked(Batch* b) {
  auto it = live_.find(b->id);
  retired_.push_back(std::move(it->second));
  live_.erase(it);
}

namespace {

// Runs read() under the batch's guard while its future has not completed.
template <class B>
GuardedReadFn guarded_read(B* b) {
  return [b](const std::function<void()>& read) {
    std::shared_lock<std::shared_mutex> g(b->guard);
    if (!b->takes_reads()) return false;
    read();
    return true;
  };
}

}  // namespace

namespace {

// A future's error text for one key: "<op> of key K failed: <why>". K and <why> are each clipped to the bound of a
// per-key error text on the wire (proto::kMaxMessageBytes, 256 bytes; a gateway's <why> arrives clipped so), K marked
// "... (N bytes)" when cut: the text of a store of an over-long key repeated the whole key (review34: 1.2 KB for a
// 1113-byte key), of a valid one up to 1 KiB. Clipped between UTF-8 characters (util/clip.h).
std::string key_failure(const char* op, std::string_view key, const Status& st) {
  const std::string_view shown = clip_utf8(key, proto::kMaxMessageBytes);
  std::string text = std::string(op) + " of key ";
  text += shown;
  if (shown.size() < key.size()) text += "... (" + std::to_string(key.size()) + " bytes)";
  text += " failed: ";
  text += clip_utf8(st.message(), proto::kMaxMessageBytes);
  return text;
}

}  // namespace

void Connector::put_results(const Task& t, const Status* st) {
  Batch* b = t.batch;
  for (size_t i = 0; i < t.end - t.begin; i++) {
    b->results[t.begin + i] = st[i].ok();
    if (!st[i].ok()) b->note_error(key_failure("store", b->keys[t.begin + i], st[i]));
  }
}

void Connector::take_puts_locked(uint64_t cap, std::vector<Task>* run, bool more) {
  auto bytes_of = [](const Task& t) {
    uint64_t n = 0;
    for (size_t i = t.begin; i < t.end; i++) n += t.batch->buffers[i].size;
    return n;
  };
  const size_t workers = static_cast<size_t>(std::max(1, opts_.num_workers));
  // A free worker: ceil((queued + this one) / workers) in all. A run written, not synced (more): ceil(queued /
  // workers) besides it, the rest left to the other workers.
  const size_t share =
      more ? run->size() + (tasks_.size() + workers - 1) / workers : (tasks_.size() + workers) / workers;
  uint64_t bytes = 0;
  for (const Task& t : *run) bytes += bytes_of(t);
  while (run->size() < share && !tasks_.empty() && tasks_.front().batch->op == OpType::kSet) {
    const uint64_t more_bytes = bytes_of(tasks_.front());
    if (bytes + more_bytes > cap) break;
    bytes += more_bytes;
    run->push_back(tasks_.front());  // first: a std::bad_alloc leaves it queued
    tasks_.pop_front();
  }
}

void Connector::run_puts(BackendSession& session, std::vector<Task>& run, uint64_t cap, Clock::time_point* late_taken,
                         Clock::time_point* late_ready) {
  struct Slice {
    Task task;  // a copy: `run` grows (more) while the slices are stored
    std::vector<PutItem> items;
    std::vector<Status> st;
    GuardedReadFn guarded;
  };
  // Each slice's PutSlice points into its Slice: the vectors are reserved before the first is made, never grown.
  auto make = [this](const std::vector<Task>& tasks, size_t from, std::vector<Slice>* own,
                     std::vector<BackendSession::PutSlice>* slices) {
    own->reserve(tasks.size() - from);
    slices->reserve(tasks.size() - from);
    for (size_t k = from; k < tasks.size(); k++) {
      const Task& t = tasks[k];
      Batch* b = t.batch;
      if (b->is_completed()) continue;  // timed out or closed while queued
      Slice& s = own->emplace_back(Slice{t, {}, std::vector<Status>(t.end - t.begin), guarded_read(b)});
      for (size_t i = t.begin; i < t.end; i++) s.items.push_back({b->keys[i], b->buffers[i].data, b->buffers[i].size});
      slices->push_back({s.items.data(), s.items.size(), s.st.data(), b->deadline, &s.guarded});
    }
  };
  std::vector<Slice> own;
  std::vector<BackendSession::PutSlice> slices;
  make(run, 0, &own, &slices);
  // The store slices queued by the time the run's writes are done (session 35, brief disk35): written before the
  // run's sync, which makes them durable too, instead of waiting for the next run and a sync of their own. Taken
  // as take_puts_locked takes them (the share keeps the other workers fed; within `cap`), once a run; nothing is
  // waited for. Their slice times count from the run's take.
  std::vector<Slice> more_own;
  std::vector<BackendSession::PutSlice> more_slices;
  const BackendSession::MoreSlicesFn more = [&](const BackendSession::PutSlice** out) -> size_t {
    const Clock::time_point ready = Clock::now();  // the run's writes done: a slice can be taken late from here
    const size_t first = run.size();
    try {
      std::lock_guard<std::mutex> lock(mu_);
      take_puts_locked(cap, &run, true);
    } catch (...) {  // out of memory for more: those taken (each in run once) go on
    }
    if (run.size() == first) return 0;
    *late_ready = ready;
    *late_taken = Clock::now();
    try {
      make(run, first, &more_own, &more_slices);
    } catch (...) {
      // Out of memory for their slices: each taken one not made (one half made is dropped: its results would read
      // Ok) fails; the run's finish completes it.
      while (more_own.size() > more_slices.size()) more_own.pop_back();
      for (size_t k = first; k < run.size(); k++) {
        const Task& t = run[k];
        bool made = false;
        for (const Slice& s : more_own) made |= s.task.batch == t.batch && s.task.begin == t.begin;
        if (made || t.batch->is_completed()) continue;
        std::fill(t.batch->results.begin() + t.begin, t.batch->results.begin() + t.end, 0);
        t.batch->note_error("the connector's worker has no memory for this store slice");
      }
    }
    *out = more_slices.data();
    return more_slices.size();
  };
  if (!slices.empty()) session.put_slices(slices.data(), slices.size(), cap ? &more : nullptr);
  for (const Slice& s : own) put_results(s.task, s.st.data());
  for (const Slice& s : more_own) put_results(s.task, s.st.data());
}

void Connector::run_task(BackendSession& session, const Task& t) {
  Batch* b = t.batch;
  if (b->is_completed()) return;  // timed out or closed while queued
  size_t n = t.end - t.begin;
  std::vector<std::string_view> keys(b->keys.begin() + t.begin, b->keys.begin() + t.end);
  GuardedReadFn guarded = guarded_read(b);
  switch (b->op) {
    case OpType::kSet: {
      std::vector<PutItem> items(n);
      for (size_t i = 0; i < n; i++) items[i] = {keys[i], b->buffers[t.begin + i].data, b->buffers[t.begin + i].size};
      std::vector<Status> st(n);
      session.put(items.data(), n, st.data(), b->deadline, guarded);
      put_results(t, st.data());
      break;
    }
    case OpType::kGet: {
      std::vector<Status> st(n);
      DeliverFn deliver = [this, b, &t](size_t i, size_t size, const CopyFn& copy) {
        const Buffer& dst = b->buffers[t.begin + i];
        std::shared_lock<std::shared_mutex> g(b->guard);
        if (!b->takes_reads()) return false;
        if (size != dst.size) {
          ADP_WARN_LIMITED("object %s holds %zu bytes but the load buffer has %zu: served as a miss",
                           log_safe(b->keys[t.begin + i]).c_str(), size, dst.size);
          return false;
        }
        if (test_delivery_delay_.count() > 0) std::this_thread::sleep_for(test_delivery_delay_);
        return copy(dst.data);
      };
      std::vector<size_t> sizes(n);
      std::vector<uint8_t*> dsts(n);
      for (size_t i = 0; i < n; i++) {
        sizes[i] = b->buffers[t.begin + i].size;
        dsts[i] = b->buffers[t.begin + i].data;
      }
      session.get(keys.data(), sizes.data(), dsts.data(), n, st.data(), b->deadline, deliver, guarded);
      for (size_t i = 0; i < n; i++) {
        b->results[t.begin + i] = st[i].ok();
        if (!st[i].ok() && !st[i].is_not_found()) b->note_error(key_failure("load", keys[i], st[i]));
      }
      break;
    }
    case OpType::kExists: {
      // A lookup that could not be answered fails the future (LMCache then
      // reads every key as a miss), rather than reading as "not there".
      std::vector<Status> st(n);
      session.exists(keys.data(), n, st.data(), b->deadline);
      for (size_t i = 0; i < n; i++) {
        b->results[t.begin + i] = st[i].ok();
        if (!st[i].ok() && !st[i].is_not_found()) b->note_error(key_failure("lookup", keys[i], st[i]));
      }
      break;
    }
    case OpType::kDelete: {
      // LMCache reads only the per-key bools of a delete: true lets it forget
      // the key (its usage and eviction order), false keeps it to evict again.
      // A key that is not on the card is gone either way (true); a delete that
      // failed leaves the object readable (false), and fails the future.
      std::vector<Status> st(n);
      session.remove(keys.data(), n, st.data(), b->deadline);
      for (size_t i = 0; i < n; i++) {
        b->results[t.begin + i] = st[i].ok() || st[i].is_not_found();
        if (!b->results[t.begin + i]) b->note_error(key_failure("delete", keys[i], st[i]));
      }
      break;
    }
  }
}

void Connector::note_timing(OpTiming& m, const SliceTimes& at, bool completed, const BackendSession* session) {
  auto add = [](std::atomic<uint64_t>& a, Clock::duration d) {
    a.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()),
                std::memory_order_relaxed);
  };
  m.slices.fetch_add(1, std::memory_order_relaxed);
  add(m.queue_ns, at.taken - at.submitted);
  add(m.pickup_ns, at.taken - std::max(at.submitted, at.free_since));
  add(m.run_ns, at.ran - at.taken);
  add(m.done_ns, at.done - at.ran);
  if (completed) {
    m.batches.fetch_add(1, std::memory_order_relaxed);
    add(m.batch_ns, at.done - at.submitted);
  }
  if (session && session->times.requests) {
    const CallTimes& c = session->times;
    m.sent_slices.fetch_add(1, std::memory_order_relaxed);
    add(m.setup_ns, c.first_sent - at.taken);
    m.requests.fetch_add(c.requests, std::memory_order_relaxed);
    m.round_trip_ns.fetch_add(c.round_trip_ns, std::memory_order_relaxed);
    add(m.finish_ns, at.ran - c.last_reply);
  }
  // Spins count whether or not their reply was read (a gateway gone meanwhile).
  if (session && session->times.reply_spins) {
    m.reply_spins.fetch_add(session->times.reply_spins, std::memory_order_relaxed);
    m.reply_spin_hits.fetch_add(session->times.reply_spin_hits, std::memory_order_relaxed);
  }
}

namespace {

// An exception's reason for a log line or a batch's error (no allocation).
const char* reason_of(const std::exception* e) noexcept {
  if (!e) return "an exception of unknown type";
  return dynamic_cast<const std::bad_alloc*>(e) ? "out of memory: std::bad_alloc" : e->what();
}

}  // namespace

std::unique_ptr<BackendSession> Connector::open_session(int index, char* why, size_t why_size) noexcept {
  try {
    return backend_->new_session();
  } catch (const std::exception& e) {
    std::snprintf(why, why_size, "%s", reason_of(&e));
    try {
      static LogRateLimit limit;
      uint64_t held_back = 0;
      if (limit.allow(&held_back))
        ADP_ERROR(
            "ADPConnector: worker %d has no backend session (%s): its batches fail until it has one [%llu like it "
            "held back]",
            index, reason_of(&e), static_cast<unsigned long long>(held_back));
    } catch (...) {
    }
  } catch (...) {
    std::snprintf(why, why_size, "%s", reason_of(nullptr));
  }
  return nullptr;
}

void Connector::fail_slices(int index, const std::vector<Task>& run, const std::exception* e) noexcept {
  const char* why = reason_of(e);
  if (card_store_unwound()) {
    // An embedded card's store operation left half done (a store's ticket every later store waits behind):
    // going on would hang or lose stores. The process ends, as the gateway's does (client_handler.cc).
    ADP_ERROR("ADPConnector: worker %d: %s left the card store's operation half done: this process cannot go on", index,
              why);
    std::terminate();
  }
  // Nothing of the slices reads as done (a store indexed, a key found): the future fails as a whole.
  for (const Task& t : run) std::fill(t.batch->results.begin() + t.begin, t.batch->results.begin() + t.end, 0);
  // Made in place (session 30): where memory stays out the text's std::string failed too, and the batch completed
  // "no memory for the reason" though the reason was the want of memory.
  char text[160];
  std::snprintf(text, sizeof text, "the connector's worker failed this batch (%s)", why);
  for (const Task& t : run) t.batch->note_error(text);
  try {
    ADP_ERROR(
        "ADPConnector: worker %d: a %s batch of %zu keys failed on an exception (%s): its future fails, the worker "
        "goes on (with a new backend session)",
        index, op_name(run[0].batch->op), run[0].batch->keys.size(), why);
  } catch (...) {
  }
}

void Connector::worker_loop(int index, bool second) {
  set_thread_name(second ? "adp-twin" : "adp-worker", index);  // a lane's second thread: adp-twin-N
  // The worker's lane (two threads taking turns writing: lanes_), or none. `turn`: this thread holds the lane's
  // writing turn; let_go() gives it to the other thread (once a store run's writes are done: written_hook; and at
  // the end). Made once a thread: nothing allocated a run.
  Lane* const lane = lanes_ ? &lanes_[index] : nullptr;
  bool turn = false;
  const std::function<void()> let_go = [lane, &turn] {
    if (!turn) return;
    turn = false;
    {
      std::lock_guard<std::mutex> l(lane->mu);
      lane->writing = false;
    }
    lane->cv.notify_one();
  };
  auto own = [&](BackendSession* s) {
    if (s && lane) s->written_hook = let_go;  // a copy of a captured pair: once a session, not a run
  };
  // Why the last session could not be made, for the batches this worker fails while it has none.
  char no_session[120] = {};
  std::unique_ptr<BackendSession> session = open_session(index, no_session, sizeof no_session);
  own(session.get());
  // One session reaches its peer at start, on a thread of its own (neither the constructor nor this worker waits
  // on it): a gateway that cannot be reached, or refuses the token, shows in stats and /health before any traffic
  // (audit 13 item 6). An exception out of it is logged, and the first batch connects (session 26: it ended the
  // process, std::terminate).
  if (index == 0 && !second && session) {
    try {
      session->prepare();
    } catch (const std::exception& e) {
      try {
        ADP_ERROR("ADPConnector: worker %d: the start-up connect failed to begin (%s): the first batch connects", index,
                  reason_of(&e));
      } catch (...) {
      }
    } catch (...) {
    }
  }
  Clock::time_point free_since{};  // when this worker was last done with a slice
  for (;;) {
    // A durable embedded card stores the slices queued behind one another with one sync (put_slices).
    const uint64_t put_cap = session ? session->put_slices_bytes() : 0;
    std::vector<Task> run;  // one task, or store slices taken together
    try {
      run.reserve(1);  // room for the slice before it is taken (out of memory: none taken, tried again)
    } catch (...) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    // The turn is given up only as a store's sync begins (written_hook): a thread whose run made none (a load, a
    // store refused before any write) keeps it and takes the next run, with no hand-off between the two threads.
    if (lane && !turn) {  // the other thread's run written: this one takes the next
      std::unique_lock<std::mutex> l(lane->mu);
      lane->cv.wait(l, [lane] { return !lane->writing; });
      lane->writing = turn = true;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return closed_ || !tasks_.empty(); });
      if (tasks_.empty()) break;  // closed and nothing left (the turn given back below)
      run.push_back(tasks_.front());
      tasks_.pop_front();
      try {
        if (put_cap && run[0].batch->op == OpType::kSet) take_puts_locked(put_cap, &run);
      } catch (...) {  // out of memory for more: the slices taken (each popped once in run) go on their own
      }
    }
    const Clock::time_point taken = Clock::now();
    // The slices a store run takes once its first ones are written (run_puts) come after these, taken later.
    const size_t taken_first = run.size();
    Clock::time_point late_taken = taken, late_ready = taken;
    // Read now: once its last slice is done, a drain() may free the batch.
    const OpType op = run[0].batch->op;
    // Every exception of a slice's run fails its batch (session 26: one out of this loop ended the process), and
    // the session that threw is replaced (its connection may be left mid-request).
    bool threw = false;
    if (!session) own((session = open_session(index, no_session, sizeof no_session)).get());
    if (session) {
      session->times = CallTimes{};
      try {
        // A durable disk card's store slice goes through put_slices even alone: it may take the slices queued
        // while it is written (run_puts).
        if (run.size() == 1 && !(put_cap && op == OpType::kSet))
          run_task(*session, run[0]);
        else
          run_puts(*session, run, put_cap, &late_taken, &late_ready);
      } catch (const std::exception& e) {
        threw = true;
        fail_slices(index, run, &e);
      } catch (...) {
        threw = true;
        fail_slices(index, run, nullptr);
      }
    } else {
      // With the reason (session 31: the batch said "worker has no backend session" alone, the reason in the ERROR
      // line only, rate-limited at that), made in place: the want of memory is the likeliest one.
      char text[160];
      std::snprintf(text, sizeof text, "worker has no backend session (%s)", no_session);
      for (const Task& t : run) t.batch->note_error(text);
    }
    const Clock::time_point ran = Clock::now();
    if (op == OpType::kSet) {
      put_timing_.runs.fetch_add(1, std::memory_order_relaxed);
      put_timing_.late_slices.fetch_add(run.size() - taken_first, std::memory_order_relaxed);
    }
    for (size_t k = 0; k < run.size(); k++) {
      const Clock::time_point submitted = run[k].batch->submitted;  // its batch lives until its last slice is done
      const bool completed = finish_task(index, run[k].batch);
      const Clock::time_point done = Clock::now();
      // A late slice's times count from its own take: it was submitted after the run's (session 35's branch counted
      // them from the run's take, and its queue and pickup, negative, read ~4.5e12 us a slice). Its pickup counts
      // from its run's writes done (late_ready), when it could first be taken, or its submit if later: until debt37
      // from the worker's previous run done (free_since), so the run's whole write phase read as pickup (review36).
      const bool late = k >= taken_first;
      const Clock::time_point at = late ? late_taken : taken, from = late ? late_ready : free_since;
      // A call's requests and spins count once (with its first slice).
      if (op == OpType::kSet || op == OpType::kGet)
        note_timing(op == OpType::kSet ? put_timing_ : get_timing_, {submitted, from, at, ran, done}, completed,
                    k == 0 ? session.get() : nullptr);
    }
    if (threw) session.reset();  // the next batch opens a new one
    free_since = Clock::now();
  }
  if (lane) let_go();  // closed: the other thread sees it too
}

void Connector::deadline_loop() {
  set_thread_name("adp-deadline");
  std::unique_lock<std::mutex> lock(mu_);
  // What allocates here comes before anything changes, and a std::bad_alloc is waited out (deadline_pause): the
  // future must complete, or its buffers would never be given back. Session 27: an exception out of publishing a
  // time-out's completion ended the process (std::terminate).
  int out_of_memory = 0;  // failed tries in a row
  while (!closed_) {
    if (deadlines_.empty()) {
      deadline_cv_.wait(lock);
      continue;
    }
    auto first = deadlines_.begin()->first;
    if (Clock::now() < first) {
      deadline_cv_.wait_until(lock, first);
      continue;
    }
    Batch* b = deadlines_.begin()->second;
    Completion c;
    try {
      ADP_DEBUG("future %llu timed out", static_cast<unsigned long long>(b->id));
      // Test builds' allocation failures (thread_alloc_test part deadline) also come here.
      c = make_completion_locked(b, false, "timed out after " + std::to_string(opts_.timeout_ms) + " ms", false);
    } catch (...) {
      deadline_pause(lock, out_of_memory++);  // b is still due: looked at again after the pause
      continue;
    }
    // Marked completed only if no read into its buffers is in flight (its guard free), never waiting for one under
    // mu_ or not: there is one deadline thread, and a guard held for long (a load into registered memory whose
    // stopped gateway holds the WRITING lease; a hung card read) held back every other future's deadline with it
    // (review33b F1). A held batch stays pending and due: looked at again 1 ms later, doubling to 50 ms (a stuck
    // one costs 20 wake-ups a second); `overdue` refuses its further reads, so a delivery in flight (a memcpy's
    // time) is the most it waits for. Its future completes when its worker lets go: here or by task_done.
    switch (b->try_mark_completed()) {
      case Batch::Mark::kMarked: {
        out_of_memory = 0;
        {
          // Written with mu_ released (Signal): the loop looks at deadlines_ afresh once it has it again.
          Signal sig(*this);
          commit_locked(b, std::move(c), false, sig);  // room made by make_completion_locked; its tasks retire it
          lock.unlock();
        }
        lock.lock();
        break;
      }
      case Batch::Mark::kAlready:  // not met: a batch is completed and its deadline dropped under mu_ together
        deadlines_.erase(b->deadline_it);
        b->deadline_it = deadlines_.end();
        break;
      case Batch::Mark::kHeld: {
        // Moved, not erased and added again: the node is kept (a std::bad_alloc would lose its deadline).
        auto node = deadlines_.extract(b->deadline_it);
        node.key() = Clock::now() + std::chrono::milliseconds(std::min(50, 1 << std::min(b->held_tries++, 6)));
        b->deadline_it = deadlines_.insert(std::move(node));
        break;
      }
    }
  }
}

void Connector::deadline_pause(std::unique_lock<std::mutex>& lock, int tries) noexcept {
  if (tries == 0) {
    try {
      ADP_ERROR("ADPConnector: the deadline thread has no memory to time out a batch (std::bad_alloc): trying again");
    } catch (...) {
    }
  }
  lock.unlock();
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, 1 << std::min(tries, 7))));
  lock.lock();
}

namespace {
// Every connector of this process, for fork()'s handlers (Connector::fork_prepare). Leaked: a fork during static
// destruction still finds it.
struct ForkList {
  std::mutex mu;
  std::vector<Connector*> all;
};
ForkList& fork_list() {
  static ForkList* const l = new ForkList;
  return *l;
}
}  // namespace

void Connector::enlist() {
  // Registered with the first connector, after the line's lock's handlers (util/log.h, log_fork_handlers; review40b):
  // prepare handlers run in the reverse order, so a thread holding mu_ while it logs a line finishes it before the
  // fork takes the line's lock, the last one a fork takes. It fails only without memory (ENOMEM): then a child finds
  // no pending future of the parent's, and makes its eventfd at its first call (inherited_first_locked), as before.
  log_fork_handlers();
  static const int registered =
      ::pthread_atfork(&Connector::fork_prepare, &Connector::fork_parent, &Connector::fork_child);
  (void)registered;
  ForkList& l = fork_list();
  std::lock_guard<std::mutex> lock(l.mu);
  l.all.push_back(this);
}

void Connector::delist() noexcept {
  ForkList& l = fork_list();
  std::lock_guard<std::mutex> lock(l.mu);
  l.all.erase(std::remove(l.all.begin(), l.all.end(), this), l.all.end());
}

void Connector::fork_prepare() noexcept {
  ForkList& l = fork_list();
  l.mu.lock();
  for (Connector* c : l.all) {
    // One inherited already (this process a forked child): its mu_ may be held for ever (by a thread of the parent's
    // at that fork), and its state is inherited_mu_'s.
    c->fork_took_inherited_ = c->inherited();
    (c->fork_took_inherited_ ? c->inherited_mu_ : c->mu_).lock();
  }
}

void Connector::fork_parent() noexcept {
  ForkList& l = fork_list();
  for (Connector* c : l.all) (c->fork_took_inherited_ ? c->inherited_mu_ : c->mu_).unlock();
  l.mu.unlock();
}

void Connector::fork_child() noexcept {
  ForkList& l = fork_list();
  for (Connector* c : l.all) {
    c->forked_child();
    (c->fork_took_inherited_ ? c->inherited_mu_ : c->mu_).unlock();
  }
  l.mu.unlock();
}

void Connector::forked_child() noexcept {
  try {
    if (!fork_took_inherited_) {
      // The opener's connector, mu_ held since before the fork: its futures not drained there are this child's
      // (its copies of them), and no thread here completes them. Those done at the fork as they were, those lost by
      // close() as drain() would make them, the others refused as this child's own submit() refuses them.
      inherited_next_ = next_future_;  // ids go on from the parent's: none handed out twice
      std::string refused;
      for (const Completion& c : completions_) inherited_done_.push_back(c);
      for (Batch* b = lost_; b; b = b->lost_next)
        inherited_done_.push_back({b->id, false, kClosedError, std::vector<uint8_t>(b->keys.size(), 0)});
      for (const auto& [id, b] : live_) {
        if (b->completed) continue;  // its completion in completions_ (above), or drained by the parent
        const bool fails = b->op == OpType::kSet || b->op == OpType::kDelete;
        if (fails && refused.empty()) refused = inherited_error();
        inherited_done_.push_back({id, !fails, fails ? refused : "", std::vector<uint8_t>(b->keys.size(), 0)});
      }
      std::sort(inherited_done_.begin(), inherited_done_.end(),
                [](const Completion& a, const Completion& b) { return a.future_id < b.future_id; });
    }
  } catch (...) {
    // No memory: those not handed over are never completed here, as before fork40.
  }
  inherited_setup_locked(fork_count());
}

void Connector::inherited_setup_locked(uint64_t forks) noexcept {
  // The parent's count at the fork (where no fork handler set it): its futures' ids are not reused. A child of a
  // child goes on from its parent's.
  if (inherited_forks_ == 0) inherited_next_ = next_future_;
  inherited_forks_ = forks;
  // An eventfd of this process's on the same number: the inherited one is the parent's (this child's signal would
  // wake its drainer, and its drain() would take this child's), and in a child of a child its parent's (review39).
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd >= 0 && ::dup3(fd, event_fd_, O_CLOEXEC) == event_fd_) ::close(fd);
  if (!inherited_done_.empty()) signal();  // completions its parent had not drained at the fork: this process's too
}

std::string Connector::inherited_error() const {
  const std::string parent = std::to_string(owner_.pid());
  return "this connector was opened by pid " + parent + "; this process (pid " + std::to_string(::getpid()) +
         ") was forked from pid " + parent +
         ": nothing is stored or deleted here; open a new ADPConnector in this "
         "process";
}

void Connector::inherited_first_locked() {
  const uint64_t forks = fork_count();
  if (inherited_forks_ != forks) inherited_setup_locked(forks);  // no fork handler of the connectors ran here
  if (inherited_said_ == forks) return;
  inherited_said_ = forks;
  const int parent = static_cast<int>(owner_.pid());
  ADP_ERROR(
      "ADPConnector (%s): used in pid %d, forked from pid %d that opened it: here its stores and deletes fail and "
      "its loads and lookups miss, nothing sent to the card or gateway (pid %d's: two processes writing one card "
      "through their own views of it overwrite each other's records, and frames of two processes on one connection "
      "interleave); open a new ADPConnector in this process (an embedded card is its opener's: a gateway shares one "
      "card between processes)",
      description_.c_str(), static_cast<int>(::getpid()), parent, parent);
}

uint64_t Connector::refuse_inherited(OpType op, size_t n, std::unique_ptr<BufferOwner> owner) {
  const bool fails = op == OpType::kSet || op == OpType::kDelete;
  std::lock_guard<std::mutex> lock(inherited_mu_);
  inherited_first_locked();
  Completion c{inherited_next_++, !fails, "", std::vector<uint8_t>(n, 0)};
  if (fails) c.error = inherited_error();
  inherited_done_.reserve(inherited_done_.size() + 1);
  if (owner) inherited_owners_.push_back(std::move(owner));
  inherited_done_.push_back(std::move(c));
  signal();
  return inherited_done_.back().future_id;
}

std::vector<Completion> Connector::drain_inherited() {
  std::vector<Completion> out;
  std::vector<std::unique_ptr<BufferOwner>> owners;  // destroyed after the lock, on the caller's thread
  std::lock_guard<std::mutex> lock(inherited_mu_);
  inherited_first_locked();  // the eventfd read below is this process's
  uint64_t v;
  ssize_t r = ::read(event_fd_, &v, sizeof v);
  (void)r;
  out.swap(inherited_done_);
  owners.swap(inherited_owners_);
  return out;
}

std::vector<Completion> Connector::drain() {
  if (inherited()) return drain_inherited();
  uint64_t v;
  ssize_t r = ::read(event_fd_, &v, sizeof v);  // resets the counter; EAGAIN when already zero
  (void)r;
  std::vector<Completion> out;
  std::vector<std::unique_ptr<Batch>> retired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      collect_lost_locked();
    } catch (...) {
      // No memory (Python: MemoryError): the counter set again, so a waiter polling the eventfd drains again
      // (under mu_: the caller is the drainer itself, no other waits for this wake-up).
      signal();
      throw;
    }
    out.swap(completions_);
    retired.swap(retired_);
  }
  return out;  // `retired` (and its buffer owners) is destroyed here, on the caller's thread
}

void Connector::free_retired() {
  if (inherited()) return;  // mu_ is the parent's (a thread of its may have held it at the fork)
  std::vector<std::unique_ptr<Batch>> retired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    retired.swap(retired_);
  }
}

void Connector::close() noexcept {
  if (inherited()) return;  // nothing of the parent's stopped or closed here: see inherited()
  if (!stop_threads()) return;
  // Nothing here throws out (session 28: ~Connector calls it): the stats of the closing line without memory for
  // them (a RemoteBackend's) are left out of it.
  StoreStats st;
  bool have_stats = true;
  try {
    st = backend_->stats();
  } catch (...) {
    have_stats = false;
  }
  {
    std::unique_lock<std::shared_mutex> bl(backend_mu_);
    backend_.reset();
  }
  if (!have_stats) {
    ADP_INFO("ADPConnector closed: %s (no memory for its stats)", description_.c_str());
    return;
  }
  ADP_INFO("ADPConnector closed: %s (lookups: %llu keys found, %llu not; loads: %llu hits, %llu misses; %llu stores)",
           description_.c_str(), static_cast<unsigned long long>(lookup_hits_.load()),
           static_cast<unsigned long long>(lookup_misses_.load()), static_cast<unsigned long long>(st.hits),
           static_cast<unsigned long long>(st.misses), static_cast<unsigned long long>(st.stores));
}

StoreStats Connector::stats() const {
  StoreStats s;
  if (!inherited()) {  // in a forked child nothing of the parent's backend is asked (its locks may be held)
    std::shared_lock<std::shared_mutex> bl(backend_mu_);
    if (backend_) s = backend_->stats();
  }
  s.lookup_hits = lookup_hits_.load(std::memory_order_relaxed);
  s.lookup_misses = lookup_misses_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace adp
