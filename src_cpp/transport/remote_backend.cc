// SPDX-License-Identifier: Apache-2.0
#include "transport/remote_backend.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "transport/card_io_error.h"
#include "util/log.h"
#include "util/piece_pool.h"
#include "util/thread_name.h"

namespace adp {
namespace {

using proto::Clock;
using std::chrono::milliseconds;

// A request's wait for its reply looks at the stall this often (logs its
// start without a stats() call: RemoteSession::wait_reply;
// ADP_TEST_STALL_CHECK_MS for tests: RemoteBackend::stall_check_).
constexpr milliseconds kStallCheck{250};
constexpr milliseconds kFirstBackoff{50}, kMaxBackoff{2000};
// While the link is up, the reconnect thread looks at the connections this
// often, and an idle connector with none open asks the gateway a status
// query this often (RemoteBackend::reconnect_loop): a stop is seen within it
// (plus the query's connect: at once on a stopped gateway, connect_timeout_
// on one that accepts and never answers).
constexpr milliseconds kIdleLook{1000};
// A batch that needs a connection while the start-up connect (prepare) is
// still being made waits for it this long at most (half its time left, if
// less), then connects on its own: a gateway that answers the handshake
// within it gives the batch that connection (no second one), and one that
// leaves it unanswered holds the batch no longer than this.
constexpr milliseconds kStartWait{100};

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// r4: how long a client waiting for the gateway's next piece spins before
// it sleeps on the ticket, and the longest sleep (then it looks at the
// socket: a gateway that died never bumps the ticket).
constexpr std::chrono::microseconds kPieceSpin{10};
constexpr std::chrono::microseconds kPieceSleep{1000};

// reply_spin_us (RemoteSession::spin_for_reply): a worker's spin for a reply
// starts this long (or a 32nd of the round trip it expects, if more) before
// that round trip, so that its sleep's own wake-up (a timer's: as slow as the
// socket's on an idle CPU, and late by a 1000th of the sleep at most) lands
// before the reply; the timer slack its sleeps then have.
constexpr std::chrono::microseconds kReplySpinLead{50};
constexpr unsigned long kReplySpinTimerSlackNs = 1000;
// The spin's own record, per op and session (RemoteSession::SpinRecord): once
// fewer than kReplySpinMinHits of its last kReplySpinRecord spins caught the
// reply, it pauses; paused, 1 wait in kReplySpinProbeEvery spins as a probe,
// and a probe that catches its reply ends the pause.
constexpr int kReplySpinRecord = 16;
constexpr int kReplySpinMinHits = 4;
constexpr int kReplySpinProbeEvery = 16;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Whether a failed call says the gateway (not just this request) is in trouble.
bool link_failure(const Status& s) { return s.code() != Status::Code::kTimedOut; }

// Whether the gateway process is gone (or a zombie): its lease then holds nothing.
// Never throws (a lease's revoke runs in a destructor): no memory to read its state, not known gone.
bool process_gone(int pid) noexcept {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  try {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    size_t paren = line.rfind(')');
    return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
  } catch (...) {
    return false;
  }
}

// Proves that p and file offset `offset` are the same memory (a cached
// mapping may have been replaced): a nonce written through p must read back
// through the file. p's own 8 bytes are put back. Caller holds the batch's
// guard (p is the caller's buffer).
bool aliases(uint8_t* p, const SegmentFile& f, uint64_t offset) {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  uint64_t nonce = counter.fetch_add(0x9E3779B97F4A7C15ull) | 1, saved, seen = 0;
  std::memcpy(&saved, p, 8);
  std::memcpy(p, &nonce, 8);
  bool same = ::pread(f.fd, &seen, 8, static_cast<off_t>(offset)) == 8 && seen == nonce;
  std::memcpy(p, &saved, 8);
  return same;
}

}  // namespace

// What one operation sends: keys, the payload room each needs (put: its
// bytes; get: the caller's buffer) and, for put, where the bytes are.
struct RoundInput {
  proto::Op op;
  const std::string_view* keys;
  const size_t* sizes;           // null for exists/delete
  const uint8_t* const* src;     // put only
  const GuardedReadFn* guarded;  // put only: src is read only inside it
  const DeliverFn* deliver;      // get only: where a round's pieces go as they land (r4)
};

// Receives each key's outcome; data points at a get's bytes (ring or reply).
using FinishFn = std::function<void(size_t i, const Status& st, const uint8_t* data, size_t size)>;

// Which file and offset back an address now, asked of the kernel
// (PROCMAP_QUERY on /proc/self/maps, Linux 6.11+): reads and writes nothing
// of the buffer. One per session thread.
enum class MapProof { kSame, kDiffers, kUnsupported };
struct ProcmapQuery {  // include/uapi/linux/fs.h, not in older headers
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104, "struct procmap_query");
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaReadable = 0x01, kVmaWritable = 0x02, kVmaShared = 0x08;

class MapQuery {
 public:
  MapQuery() : fd_(::open("/proc/self/maps", O_RDONLY | O_CLOEXEC)) {}
  ~MapQuery() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool supported() {
    if (fd_ < 0) return false;
    if (!probed_) {
      probed_ = true;
      ProcmapQuery q{};
      q.size = sizeof q;
      q.query_addr = reinterpret_cast<uintptr_t>(&q);  // the stack: always mapped
      works_ = ::ioctl(fd_, kProcmapQuery, &q) == 0;
    }
    return works_;
  }
  MapProof check(const uint8_t* p, size_t len, const SegmentFile& f, uint64_t offset) {
    if (!supported()) return MapProof::kUnsupported;
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_flags = kVmaReadable | kVmaWritable | kVmaShared;
    q.query_addr = reinterpret_cast<uintptr_t>(p);
    if (::ioctl(fd_, kProcmapQuery, &q) != 0) return MapProof::kDiffers;
    const uint64_t lo = reinterpret_cast<uintptr_t>(p);
    bool same = q.vma_start <= lo && len <= q.vma_end - lo && q.inode == f.ino &&
                makedev(q.dev_major, q.dev_minor) == f.dev && q.vma_offset + (lo - q.vma_start) == offset;
    return same ? MapProof::kSame : MapProof::kDiffers;
  }

 private:
  int fd_;
  bool probed_ = false, works_ = false;
};

SegmentFile::~SegmentFile() {
  if (fd >= 0) ::close(fd);
}

class RemoteSession : public BackendSession {
 public:
  explicit RemoteSession(RemoteBackend* backend) : backend_(backend) {}
  ~RemoteSession() override {
    if (start_thread_.joinable()) start_thread_.join();
    backend_->drop(&start_client_);
    backend_->drop(&client_);
  }

  void put(const PutItem* items, size_t n, Status* results, Deadline deadline, const GuardedReadFn& guarded) override {
    std::vector<std::string_view> keys(n);
    std::vector<size_t> sizes(n);
    std::vector<const uint8_t*> src(n);
    for (size_t i = 0; i < n; i++) {
      keys[i] = items[i].key;
      sizes[i] = items[i].size;
      src[i] = items[i].data;
    }
    auto& c = backend_->counters_;
    auto done = [&](size_t i, const Status& st) {
      results[i] = st;
      (st.ok() ? c.stores : c.store_failures).fetch_add(1, std::memory_order_relaxed);
      if (st.ok()) c.bytes_written.fetch_add(sizes[i], std::memory_order_relaxed);
    };
    // The gateway reads the caller's buffers in place only under the lease (the caller's guard held).
    std::vector<uint8_t*> bufs(n);
    for (size_t i = 0; i < n; i++) bufs[i] = const_cast<uint8_t*>(src[i]);
    if (run_into_segments(proto::Op::kPut, keys.data(), sizes.data(), bufs.data(), n, deadline, guarded, done)) return;
    run({proto::Op::kPut, keys.data(), sizes.data(), src.data(), &guarded, nullptr}, n, deadline,
        [&](size_t i, const Status& st, const uint8_t*, size_t) { done(i, st); });
  }

  void get(const std::string_view* keys, const size_t* sizes, uint8_t* const* dsts, size_t n, Status* results,
           Deadline deadline, const DeliverFn& deliver, const GuardedReadFn& guarded) override {
    auto& c = backend_->counters_;
    auto done = [&](size_t i, const Status& st) {
      results[i] = st;
      (st.ok() ? c.hits : c.misses).fetch_add(1, std::memory_order_relaxed);
      if (st.ok()) c.bytes_read.fetch_add(sizes[i], std::memory_order_relaxed);
    };
    if (run_into_segments(proto::Op::kGet, keys, sizes, dsts, n, deadline, guarded, done)) return;
    run({proto::Op::kGet, keys, sizes, nullptr, nullptr, &deliver}, n, deadline,
        [&](size_t i, const Status& st, const uint8_t* data, size_t size) {
          // The gateway checked the payload against its CRC before replying.
          // No data with a hit: delivered already, in pieces (r4).
          auto copy = [data, size](uint8_t* dst) {
            std::memcpy(dst, data, size);
            return true;
          };
          results[i] = st.ok() && data && !deliver(i, size, copy) ? Status::NotFound("not delivered") : st;
          (results[i].ok() ? c.hits : c.misses).fetch_add(1, std::memory_order_relaxed);
          if (results[i].ok()) c.bytes_read.fetch_add(size, std::memory_order_relaxed);
        });
  }

  void exists(const std::string_view* keys, size_t n, Status* results, Deadline deadline) override {
    run({proto::Op::kExists, keys, nullptr, nullptr, nullptr}, n, deadline,
        [&](size_t i, const Status& st, const uint8_t*, size_t) { results[i] = st; });
  }

  // Connects at the connector's start (BackendSession::prepare), on a thread of its own (start_connect), so
  // that no batch waits behind it: a failure is the outage a batch's would be (the one WARNING, or the token's
  // ERROR; gateway_reachable 0) and the back-off it sets holds for this session's first batch; its connection
  // is that batch's (take_start). No batch deadline: the connect's own bound (connect_timeout_), so one left
  // unanswered is an outage, not a batch cut short.
  void prepare() override {
    start_began_ = Clock::now();
    start_pending_.store(true, std::memory_order_relaxed);
    try {
      start_thread_ = std::thread(&RemoteSession::start_connect, this);
    } catch (const std::exception& e) {
      // No thread (std::system_error: a pids limit, memory for its stack; std::bad_alloc: its state): the first
      // batch connects, as before prepare() was.
      start_pending_.store(false, std::memory_order_relaxed);
      ADP_DEBUG("%s: no start-up connect (%s)", backend_->describe().c_str(), e.what());
    }
  }

  void remove(const std::string_view* keys, size_t n, Status* results, Deadline deadline) override {
    auto& c = backend_->counters_;
    run({proto::Op::kDelete, keys, nullptr, nullptr, nullptr}, n, deadline,
        [&](size_t i, const Status& st, const uint8_t*, size_t) {
          results[i] = st;
          if (st.ok()) c.deletes.fetch_add(1, std::memory_order_relaxed);
        });
  }

 private:
  Status connected(Deadline deadline);
  // A connect failed at `failed`: the session waits (backoff_) from then before its next try; the batch's
  // error.
  Status back_off(const Status& why, Clock::time_point failed);
  // The start-up connect, on start_thread_: its connection or its failure for take_start(). A failure is
  // logged and counted at once (RemoteBackend::note_start_failure), so /health says it before any batch.
  void start_connect();
  // At a batch's need of a connection while the start-up connect's outcome is not taken (start_pending_):
  // waits for it (kStartWait at most, half the time left to `deadline` if less), then takes it if it ended:
  // its connection (dropped if this session has one of its own by then) or its failure's back-off (unless
  // this session connected on its own meanwhile: its own outcome is the newer). Otherwise the batch connects
  // on its own (own_connect_), and a later outcome is taken at the next need.
  void take_start(Deadline deadline);
  // Loads into (get) or stores from (put) the caller's buffers in place when
  // all of them lie in shared memory files the gateway maps (protocol r3),
  // finishing every item; false (nothing done) to use the ring instead.
  bool run_into_segments(proto::Op op, const std::string_view* keys, const size_t* sizes, uint8_t* const* bufs,
                         size_t n, Deadline deadline, const GuardedReadFn& guarded,
                         const std::function<void(size_t, const Status&)>& finish);
  // One try of run_into_segments; false with *retry set when a frame of it
  // (a registration, the request) never reached a connection the gateway had
  // closed while it was idle (lose(): nothing finished, try again).
  bool try_in_place(proto::Op op, const std::string_view* keys, const size_t* sizes, uint8_t* const* bufs, size_t n,
                    Deadline deadline, const GuardedReadFn& guarded,
                    const std::function<void(size_t, const Status&)>& finish, bool* retry);
  // Ends the load lease of request rid: once it returns, the gateway writes
  // nothing more for it (an object being written is waited out, unless the
  // gateway died).
  void revoke_lease(uint64_t rid);
  // Drops the connection after a frame on it (a request, a segment's or
  // this process's registration) failed with `why`. True when the frame is to
  // go again at once on a new connection: `retry` (the caller's one more try)
  // and it met a connection the gateway had closed while it was idle (a
  // restart, --idle-timeout-s): it never reached it
  // (GatewayClient::unsent_on_idle(): Unix sockets, where the send fails), or,
  // `replayable` (a frame whose second serving changes nothing: not a
  // delete), the connection was found closed before anything of its answer
  // came (GatewayClient::closed_unanswered_on_idle(): TCP, where the send
  // succeeds once and the read finds it closed). Not an outage, logged at
  // DEBUG; the new connection's own failure is the one logged. Otherwise the
  // link is logged down (WARNING, once per change; a timeout at DEBUG).
  bool lose(const Status& why, bool retry, bool replayable);
  // Lays out the round starting at `begin` for the current connection;
  // returns its end (== begin when item `begin` fits no round). A put's
  // bytes are copied (into the ring, or this session's staging for TCP)
  // under the caller's guard; *abandoned is set if the future completed
  // before they all were.
  size_t plan_round(const RoundInput& in, size_t begin, size_t n, proto::BatchRequest* req, std::vector<iovec>* iov,
                    bool* abandoned);
  void run(const RoundInput& in, size_t n, Deadline deadline, const FinishFn& finish);
  // Hands the reply of one round to finish(); Ok unless the reply lies, in
  // which case no item of the round is finished (run() fails them once).
  Status finish_round(const RoundInput& in, size_t begin, const proto::BatchRequest& req,
                      const proto::BatchReply& reply, const FinishFn& finish);
  // r4: sends a get round and copies each item's pieces out of the ring as
  // the gateway publishes them (each under the batch's guard, through
  // deliver) while it reads the next ones; the rest of every hit once the
  // reply came. Ok once each item is finished; otherwise none is (run()
  // fails them) and the connection is to be dropped.
  Status call_in_pieces(const RoundInput& in, size_t begin, const proto::BatchRequest& req, Deadline deadline,
                        proto::BatchReply* reply, const FinishFn& finish);
  // Until the ticket moves from `seen`, the deadline, or at most kPieceSleep.
  void wait_for_ticket(uint32_t seen, Deadline deadline);
  // Until the reply is readable or the deadline, looking at the gateway's
  // stall every kStallCheck between (RemoteBackend::check_stall: its start is
  // logged without a scrape; review r9 H3).
  void wait_reply(Deadline deadline);
  // reply_spin_us: for the first wait of a put or get request whose like
  // (same op, same bytes) was answered before, sleeps (the socket watched)
  // until kReplySpinLead (or a 32nd of it) before the round trip expected, then polls the
  // socket without sleeping for up to reply_spin, while the load rule allows
  // (connections x 2 <= CPUs, runnable threads x 2 <= CPUs: util/idle_cpus.h)
  // and the op's spins have been catching their replies (SpinRecord).
  // True once the socket is readable, hung up or in error (the read tells
  // which); false (nothing spun, or the reply not there by the spin's end or
  // the deadline): wait_reply's own wait follows. Counted in `times` (and
  // the record) only when it polled: a reply there before the spin's start is
  // no spin.
  bool spin_for_reply(Deadline deadline);
  // A reply read: its round trip moves the expectation for requests like it.
  void expect(Clock::time_point replied);
  // client_->send(), its time noted in `times` (read before the write: the
  // gateway may read the request before send() returns).
  Status send_request(const proto::BatchRequest& req, std::span<const iovec> payload, Deadline deadline);
  // wait_reply(), then the reply read; a reply (not a kAlive frame: r8,
  // `alive`) noted in `times`, and any frame as the gateway answering (H3:
  // a stall's end logged now).
  Status read_reply(const proto::BatchRequest& req, Deadline deadline, proto::BatchReply* reply, bool* alive = nullptr);

  RemoteBackend* backend_;
  std::unique_ptr<GatewayClient> client_;
  bool connected_before_ = false;  // a connection of this session was made (and, when there is none, lost)
  // The start-up connect (prepare, start_connect, take_start).
  std::thread start_thread_;
  Clock::time_point start_began_{};
  Clock::time_point start_failed_{};        // start_mu_: when it failed
  std::atomic<bool> start_pending_{false};  // started, its outcome not taken: the worker looks (take_start)
  bool own_connect_ = false;                // worker: this session tried a connect of its own meanwhile
  std::mutex start_mu_;
  std::condition_variable start_cv_;             // start_done_ set
  bool start_done_ = false;                      // start_mu_
  Status start_status_;                          // start_mu_: its outcome
  std::unique_ptr<GatewayClient> start_client_;  // start_mu_: its connection, not taken yet
  Clock::time_point retry_at_{};
  uint64_t backoff_connects_ = 0;  // the backend's connects() when the back-off began: one made since ends it
  Clock::duration unanswered_{};   // the time waited by the connects in a row cut short by their batches' deadlines
  milliseconds backoff_{0};
  Status last_error_;
  std::vector<uint8_t> staging_;  // TCP put: the round's bytes, copied under the guard
  // Registered on client_; held, so that a file's address is never reused for another while it has an id.
  std::map<std::shared_ptr<SegmentFile>, uint32_t> segment_ids_;
  MapQuery maps_;  // this thread's PROCMAP_QUERY handle
  proto::BatchReply reply_;
  std::vector<uint64_t> copied_;  // r4: bytes of each item of the current round copied out so far
  // reply_spin: per op (0 put, 1 get), the payload bytes of its last request
  // and a low estimate of its round trip (a reply sooner sets it, a later one
  // moves it an eighth of the way: a guess that came late by a fluke is
  // mended at the next reply, one early by a fluke within a few), and the
  // request in flight: its op (-1: none to spin for or learn from), bytes and
  // write time.
  struct Expected {
    uint64_t bytes = 0;
    int64_t low_ns = 0;
  };
  Expected expected_[2];
  // reply_spin: per op, whether its spins catch their replies (review r13 S2: at 32 MiB x 4, 98% of the waits
  // spun, 1-4% caught the reply). The last kReplySpinRecord spins (a bit each, 1: the reply came while it
  // polled); once that many are in and fewer than kReplySpinMinHits caught it, paused: every
  // kReplySpinProbeEvery-th wait spins all the same (a probe), and a probe that catches its reply resumes with
  // the record emptied. A few bytes of the worker's own session: no lock, no allocation.
  struct SpinRecord {
    uint32_t hits = 0;  // bit i: the i-th latest spin caught its reply
    uint8_t spins = 0;  // spins in `hits`, up to kReplySpinRecord
    uint8_t waits = 0;  // paused: waits not spun since the last probe
    bool paused = false;
    // Whether this wait is to spin (paused: a probe; one that does not poll after all, the reply there before
    // it or the load rule against it, leaves the next wait the probe).
    bool due() {
      if (!paused || waits + 1 >= kReplySpinProbeEvery) return true;
      waits++;
      return false;
    }
    // A spin polled; `hit`: its reply came while it did.
    void note(bool hit) {
      if (paused) {
        waits = 0;
        if (hit) *this = SpinRecord{};
        return;
      }
      hits = (hits << 1 | (hit ? 1u : 0u)) & ((1u << kReplySpinRecord) - 1);
      if (spins < kReplySpinRecord) spins++;
      paused = spins == kReplySpinRecord && std::popcount(hits) < kReplySpinMinHits;
    }
  };
  SpinRecord spin_record_[2];
  int sent_op_ = -1;
  bool spin_armed_ = false;  // the request's first wait for its reply is still to come
  uint64_t sent_bytes_ = 0;
  Clock::time_point sent_at_{};
  bool slack_set_ = false;  // this worker thread's timer slack set (kReplySpinTimerSlackNs)
};

void RemoteSession::start_connect() {
  set_thread_name("adp-connect");
  const uint64_t connects = backend_->connects();
  std::unique_ptr<GatewayClient> c;
  Status s;
  try {
    s = backend_->connect(start_began_ + backend_->connect_timeout_, &c);
    if (!s.ok()) backend_->note_start_failure(s, connects);
  } catch (const std::exception& e) {
    // No memory for the connect (std::bad_alloc; escaping this thread's function it ended the process): done as if
    // it had not been tried (Ok, no connection), so the first batch connects on its own, as with no thread.
    c.reset();
    s = Status::Ok();
    // The line's description is a std::string, made only where DEBUG is logged: memory still out, its bad_alloc
    // escaped this handler and ended the process (session 29, allocinfo29; thread_alloc_test part remote, sticky).
    try {
      ADP_DEBUG("%s: the start-up connect gave up (%s)", backend_->describe().c_str(), e.what());
    } catch (...) {
    }
  }
  {
    std::lock_guard<std::mutex> l(start_mu_);
    start_done_ = true;
    start_failed_ = Clock::now();
    start_status_ = std::move(s);  // not a copy: nothing here may throw (no memory: std::terminate)
    start_client_ = std::move(c);
  }
  start_cv_.notify_all();
}

void RemoteSession::take_start(Deadline deadline) {
  std::unique_ptr<GatewayClient> extra;
  {
    std::unique_lock<std::mutex> l(start_mu_);
    if (!client_) {
      const auto now = Clock::now();
      start_cv_.wait_until(l, now + std::min<Clock::duration>(kStartWait, (deadline - now) / 2),
                           [this] { return start_done_; });
    }
    if (!start_done_) return;  // still connecting: this batch connects on its own
    start_pending_.store(false, std::memory_order_relaxed);
    if (start_client_ && client_) {
      extra = std::move(start_client_);  // this session's own connection came first
    } else if (start_client_) {
      client_ = std::move(start_client_);
      client_->held_idle();  // made at the start, idle since (used_before())
      if (connected_before_) backend_->reconnects_.fetch_add(1, std::memory_order_relaxed);
      connected_before_ = true;
      segment_ids_.clear();
    } else if (!start_status_.ok() && !own_connect_ && !backend_->closing()) {
      (void)back_off(start_status_, start_failed_);
    }
  }
  if (extra) backend_->drop(&extra);
}

Status RemoteSession::back_off(const Status& why, Clock::time_point failed) {
  // A refused token does not heal by itself (audit 12 note 22): the longest wait at once.
  backoff_ = backend_->next_backoff(backoff_, RemoteBackend::token_refusal(why));
  retry_at_ = failed + backoff_;
  backoff_connects_ = backend_->connects();
  last_error_ = Status::Unavailable(backend_->describe() + " unavailable: " + why.message());
  return last_error_;
}

Status RemoteSession::connected(Deadline deadline) {
  if (start_pending_.load(std::memory_order_relaxed)) take_start(deadline);
  if (client_ && client_->closed_while_idle()) {
    // The gateway restarted (or closed it for idleness) since this session's last batch: replaced now, before a
    // byte of this one goes out, and not an outage (a gateway still down fails the connect below, which logs it).
    ADP_DEBUG("%s: the gateway closed this session's connection while it was idle; connecting anew",
              backend_->describe().c_str());
    backend_->drop(&client_);
  }
  if (client_) return Status::Ok();
  auto now = Clock::now();
  if (now >= deadline) return Status::TimedOut("deadline passed before the gateway was reached");
  // A connection made since the back-off began (the background reconnect's, or another session's) says the gateway
  // is back: this batch connects at once (it takes the background one), not failing in front of a reachable link.
  if (now < retry_at_ && backend_->connects() == backoff_connects_) return last_error_;
  own_connect_ = start_pending_.load(std::memory_order_relaxed);
  // The batch's deadline when sooner than the connect's own bound: a timeout then is the batch's (cut_short).
  const bool own_bound = deadline > now + backend_->connect_timeout_;
  Status s = backend_->connect(own_bound ? now + backend_->connect_timeout_ : deadline, &client_, own_bound);
  // The connector closing cut it short (a connect at start, BackendSession::prepare, or a batch's racing close):
  // nothing to say about the gateway (review r13 S4: a connector closed at once logged an outage).
  if (!s.ok() && backend_->closing()) return s;
  const bool cut_short = !s.ok() && s.code() == Status::Code::kTimedOut && !own_bound;
  // Connects cut short in a row add up the time they waited, not the time since the first (review r13 S3: two
  // 300 ms connects 3 s apart were an outage).
  unanswered_ = cut_short ? unanswered_ + (Clock::now() - now) : Clock::duration{};
  if (cut_short && unanswered_ < backend_->connect_timeout_) {
    // The batch's own deadline ran out while connecting (a short timeout_ms, a busy gateway slow to accept or to
    // answer the handshake): this batch's timeout, not an outage. No back-off, gateway_reachable as it was. A
    // gateway that refuses, or leaves this session's connects unanswered for connect_timeout_ (one connect, or
    // several cut short in a row that waited that long in all), is still the outage below.
    ADP_DEBUG("%s: the batch's deadline passed while connecting (%s)", backend_->describe().c_str(),
              log_safe(s.message()).c_str());
    return Status::TimedOut("deadline passed while connecting to the gateway: " + s.message());
  }
  if (!s.ok()) {
    // From the failure, not the connect's start: a connect left unanswered for connect_timeout_ has waited out
    // any back-off by then, and the batch's next path (run() after try_in_place) connected again at once.
    (void)back_off(s, Clock::now());
    backend_->note_down(s);
    return last_error_;
  }
  backoff_ = milliseconds{0};
  if (connected_before_) backend_->reconnects_.fetch_add(1, std::memory_order_relaxed);
  connected_before_ = true;
  segment_ids_.clear();
  return Status::Ok();
}

bool RemoteSession::run_into_segments(proto::Op op, const std::string_view* keys, const size_t* sizes,
                                      uint8_t* const* bufs, size_t n, Deadline deadline, const GuardedReadFn& guarded,
                                      const std::function<void(size_t, const Status&)>& finish) {
  // A connection that died while idle (the gateway restarted) gets one more
  // try on a new one, as in run(): only when a frame of it (a registration,
  // the request) never reached the gateway, so nothing was written for it.
  bool retry = false;
  if (try_in_place(op, keys, sizes, bufs, n, deadline, guarded, finish, &retry)) return true;
  return retry && try_in_place(op, keys, sizes, bufs, n, deadline, guarded, finish, nullptr);
}

bool RemoteSession::try_in_place(proto::Op op, const std::string_view* keys, const size_t* sizes, uint8_t* const* bufs,
                                 size_t n, Deadline deadline, const GuardedReadFn& guarded,
                                 const std::function<void(size_t, const Status&)>& finish, bool* retry) {
  const bool put = op == proto::Op::kPut;
  if (!connected(deadline).ok() || n > client_->limits().max_batch_keys) return false;
  // The connection lost after `why`; one more try if lose() says so.
  auto lost = [&](const Status& why) {  // a registration: made anew on the new connection
    if (lose(why, retry != nullptr, true)) *retry = true;
    return false;
  };
  // ptracer_follow: refused while this process named another gateway that has exited since.
  if (Status s = client_->retry_process(deadline); !s.ok()) return lost(s);
  // Per buffer: in a shared memory file the gateway maps (r3), else, where
  // granted, this process's memory (r5); a batch with any other buffer: the ring.
  // A store's buffer may be read by others meanwhile: only the kernel's
  // read-only answer proves its mapping (no nonce written into it).
  const bool in_files = (put ? client_->segment_stores() : client_->segments()) && (!put || maps_.supported());
  const bool in_process = put ? client_->process_stores() : client_->process_loads();
  if (!in_files && !in_process) return false;
  // r6: a store of an object larger than the gateway's store buffer (which
  // it would refuse) goes through the ring, with the rest of its batch.
  const uint64_t process_limit = put ? client_->process_store_limit() : UINT64_MAX;
  std::vector<SegmentSpan> spans(n);
  for (size_t i = 0; i < n; i++) {
    if (!check_key(keys[i]).ok() || sizes[i] == 0) return false;
    if (in_files) spans[i] = backend_->find_segment(bufs[i], sizes[i]);
    if (spans[i].file && spans[i].file->refused) spans[i] = {};
    if (spans[i].file) continue;
    if (in_process && sizes[i] <= process_limit) continue;
    if (in_process) {
      backend_->process_stores_over_limit_.fetch_add(n, std::memory_order_relaxed);
    } else if (in_files) {
      backend_->hint_ring();
    }
    return false;
  }
  proto::BatchRequest req;
  req.op = op;
  req.items.resize(n);
  size_t process_items = 0;
  for (size_t i = 0; i < n; i++) {
    const std::shared_ptr<SegmentFile>& f = spans[i].file;
    if (!f) {  // r5: the gateway writes at the buffer's address in this process
      req.items[i] = {keys[i], sizes[i], reinterpret_cast<uintptr_t>(bufs[i]), proto::kProcessSegment};
      process_items++;
      continue;
    }
    auto it = segment_ids_.find(f);
    if (it == segment_ids_.end()) {
      uint32_t id = 0;
      Status s = client_->register_segment(f->fd, f->bytes, deadline, &id);
      if (s.code() == Status::Code::kUnavailable) {
        // The gateway refused the file (its Error frame: it cannot map it as stated) and closed the connection.
        // No outage: the file's buffers use the ring from now on, this batch's too, on a new connection.
        if (!f->refused.exchange(true))
          ADP_INFO("%s: %s; buffers in that shared memory file (%llu bytes) go through the ring from now on",
                   backend_->describe().c_str(), log_safe(s.message()).c_str(),
                   static_cast<unsigned long long>(f->bytes));
        backend_->drop(&client_);
        return false;
      }
      if (!s.ok()) return lost(s);
      if (id == 0) return false;  // this connection's ids are used up
      it = segment_ids_.emplace(f, id).first;
    }
    req.items[i] = {keys[i], sizes[i], spans[i].offset, it->second};
  }
  Status s;
  bool stale = false;
  const bool wanted = guarded([&] {
    // The buffers are still the files' memory (a cached mapping may have been replaced).
    for (size_t i = 0; i < n && !stale; i++) {
      if (!spans[i].file) continue;  // process memory: the buffer is the caller's while the guard is held
      const SegmentFile& f = *spans[i].file;
      MapProof proof = maps_.check(bufs[i], sizes[i], f, spans[i].offset);
      if (proof == MapProof::kUnsupported) {
        const size_t last = (sizes[i] - 1) & ~size_t(7);
        proof = aliases(bufs[i], f, spans[i].offset) && aliases(bufs[i] + last, f, spans[i].offset + last)
                    ? MapProof::kSame
                    : MapProof::kDiffers;
      }
      stale = proof != MapProof::kSame;
    }
    if (stale) return;
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      s = Status::TimedOut("deadline passed before the request was sent");
      return;
    }
    req.timeout_ms = static_cast<uint32_t>(std::min<long long>(left, UINT32_MAX));
    const uint64_t rid = client_->next_request_id();
    __atomic_store_n(client_->lease(), proto::lease_word(rid, proto::kLeaseOpen), __ATOMIC_RELEASE);
    // Revoked on every way out, an exception's included (session 26: the worker then fails the batch, and the
    // gateway must write nothing more into its buffers).
    struct Revoke {
      RemoteSession* session;
      uint64_t rid;
      ~Revoke() { session->revoke_lease(rid); }
    } revoke{this, rid};
    s = send_request(req, {}, deadline);
    if (s.ok()) s = read_reply(req, deadline, &reply_);
  });
  if (stale) {
    backend_->forget_segments();
    return false;
  }
  if (!wanted) s = Status::TimedOut("deadline passed");
  if (s.ok() && !put)
    for (size_t i = 0; i < n && s.ok(); i++)
      if (reply_.results[i].status.ok() && reply_.results[i].size != sizes[i])
        s = Status::InvalidArgument("gateway reply disagrees with the request");
  if (s.ok() && process_items) {
    // EPERM on a process item (this process turned non-dumpable, changed
    // its credentials or its Yama ptracer): the gateway may no longer touch
    // this process. The grant is withdrawn for this connection and the whole
    // batch goes through the ring instead of failing (a load rewrites the
    // same bytes; a store overwrites its own object).
    for (size_t i = 0; i < n; i++) {
      const Status& st = reply_.results[i].status;
      if (spans[i].file || st.code() != Status::Code::kUnavailable) continue;
      client_->withdraw_process("the gateway lost access to this process's memory: " + st.message());
      if (!backend_->process_withdrawn_logged_.exchange(true))
        ADP_INFO("%s: %s; this connection goes through the ring from now on. Logged once.",
                 backend_->describe().c_str(), log_safe(client_->process_refusal()).c_str());
      return false;
    }
  }
  // A request whose send found the connection closed never reached the gateway (nothing can have been
  // written for it): tried again at once on a new connection, quietly (audit 12; lose()). So is a store found
  // closed by its reply's read (the gateway only reads its buffers); a load may have written into them.
  if (!s.ok() && wanted && lose(s, retry != nullptr, put)) {
    *retry = true;
    return false;
  }
  for (size_t i = 0; i < n; i++) {
    const Status& st = s.ok() ? reply_.results[i].status : s;
    if (s.ok()) backend_->note_item(st);
    if (process_items && !spans[i].file && st.ok())
      (put ? backend_->process_stores_ : backend_->process_loads_).fetch_add(1, std::memory_order_relaxed);
    finish(i, st);
  }
  return true;
}

void RemoteSession::revoke_lease(uint64_t rid) {
  uint64_t* word = client_->lease();
  for (;;) {
    uint64_t expected = proto::lease_word(rid, proto::kLeaseOpen);
    if (__atomic_compare_exchange_n(word, &expected, proto::lease_word(rid, proto::kLeaseRevoked), false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return;
    if (expected != proto::lease_word(rid, proto::kLeaseWriting)) return;
    // The gateway is writing one object into the caller's buffer (a
    // memcpy's time on a memory-speed card, staged otherwise): wait it out.
    if (process_gone(client_->peer_pid())) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool RemoteSession::lose(const Status& why, bool retry, bool replayable) {
  const bool again =
      retry && client_ && (client_->unsent_on_idle() || (replayable && client_->closed_unanswered_on_idle()));
  backend_->drop(&client_);
  if (again)
    ADP_DEBUG("%s: %s (the gateway closed this connection while it was idle); it goes again on a new one",
              backend_->describe().c_str(), log_safe(why.message()).c_str());
  else if (link_failure(why))
    backend_->note_down(why);
  else
    ADP_DEBUG("%s: %s; reconnecting", backend_->describe().c_str(), log_safe(why.message()).c_str());
  return again;
}

size_t RemoteSession::plan_round(const RoundInput& in, size_t begin, size_t n, proto::BatchRequest* req,
                                 std::vector<iovec>* iov, bool* abandoned) {
  proto::SharedRing* ring = client_->ring();
  const uint64_t area = ring ? ring->size() : client_->limits().max_inline_payload;
  const uint64_t align = ring ? proto::kRingAlign : 1;
  const size_t max_keys = client_->limits().max_batch_keys;
  req->op = in.op;
  req->items.clear();
  iov->clear();
  uint64_t used = ring && client_->control_page() ? proto::kRingControlBytes : 0;  // r3/r4: the control page first
  size_t end = begin;
  for (; end < n && req->items.size() < max_keys; end++) {
    if (end > begin && !check_key(in.keys[end]).ok()) break;  // failed alone in its own round
    uint64_t size = in.sizes ? in.sizes[end] : 0;
    uint64_t offset = in.sizes ? align_up(used, align) : 0;
    if (offset > area || size > area - offset) break;
    req->items.push_back({in.keys[end], size, offset});
    used = offset + size;
  }
  *abandoned = false;
  if (!in.src || end == begin) return end;
  if (backend_->test_put_delay_.count()) std::this_thread::sleep_for(backend_->test_put_delay_);
  // Never from the caller's buffers outside its guard: TCP sends a copy.
  uint8_t* dst = ring ? ring->data() : nullptr;
  if (!ring) {
    staging_.resize(used);
    dst = staging_.data();
    iov->push_back({dst, used});
  }
  for (size_t k = 0; k < req->items.size(); k++) {
    const proto::BatchItem& it = req->items[k];
    const uint8_t* src = in.src[begin + k];
    if (!(*in.guarded)([&] { std::memcpy(dst + it.offset, src, it.size); })) {
      *abandoned = true;
      break;
    }
  }
  return end;
}

void RemoteSession::run(const RoundInput& in, size_t n, Deadline deadline, const FinishFn& finish) {
  proto::BatchRequest req;
  proto::BatchReply reply;
  std::vector<iovec> iov;
  bool retried = false;
  size_t begin = 0;
  auto fail_rest = [&](const Status& s) {
    for (size_t i = begin; i < n; i++) finish(i, s, nullptr, 0);
  };
  while (begin < n) {
    // A key the gateway would refuse (closing the connection) fails here, alone.
    Status s = check_key(in.keys[begin]);
    if (!s.ok()) {
      finish(begin++, s, nullptr, 0);
      continue;
    }
    if (in.guarded && !(*in.guarded)([] {})) return fail_rest(Status::TimedOut("deadline passed"));
    s = connected(deadline);
    if (!s.ok()) return fail_rest(s);
    bool abandoned = false;
    size_t end = plan_round(in, begin, n, &req, &iov, &abandoned);
    if (abandoned) return fail_rest(Status::TimedOut("deadline passed while the payload was copied"));
    if (end == begin) {
      std::string limit = client_->ring() ? "the ring (raise ring_mb)" : "one frame's payload";
      finish(begin,
             Status::InvalidArgument("object of " + std::to_string(in.sizes[begin]) + " bytes is larger than " + limit),
             nullptr, 0);
      begin++;
      continue;
    }
    // A round with no time left is failed, not sent with a token budget.
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return fail_rest(Status::TimedOut("deadline passed before the request was sent"));
    req.timeout_ms = static_cast<uint32_t>(std::min<long long>(left, UINT32_MAX));
    copied_.clear();
    if (in.op == proto::Op::kGet && client_->ring_progress()) {
      s = call_in_pieces(in, begin, req, deadline, &reply, finish);
    } else {
      s = send_request(req, iov, deadline);
      // r8 (TCP): a kAlive frame is the gateway heard from: look at the stall, then wait on.
      for (bool alive = s.ok(); alive;) s = read_reply(req, deadline, &reply, &alive);
      if (s.ok()) s = finish_round(in, begin, req, reply, finish);
    }
    if (!s.ok()) {
      // A connection that died while idle (gateway restarted) gets one more try on a new one,
      // unless pieces of this round reached a buffer already (a miss on the retry would then be
      // a miss with its buffer written). A request its send found the connection closed for never
      // reached the gateway: replaced quietly (lose()). One that went out and found it closed before
      // anything of its reply came (TCP sends once into a closed connection; a gateway that died under
      // it) may have been served: a put of the same key and bytes, a get, an exists give the same
      // answer again, so they go again quietly too (lose(): the new connection's failure is the outage
      // logged). A delete is tried again all the same ("not found" if it was served) and logged as the
      // outage it may be.
      const bool wrote = std::any_of(copied_.begin(), copied_.end(), [](uint64_t b) { return b > 0; });
      const bool again = client_->used_before() && !retried && s.code() == Status::Code::kClosed && !wrote;
      lose(s, again, in.op != proto::Op::kDelete);
      if (again) {
        retried = true;
        continue;
      }
      return fail_rest(s);
    }
    begin = end;
  }
}

Status RemoteSession::finish_round(const RoundInput& in, size_t begin, const proto::BatchRequest& req,
                                   const proto::BatchReply& reply, const FinishFn& finish) {
  proto::SharedRing* ring = client_->ring();
  // Checked whole before any item is finished: run() fails the round's items
  // when it lies, and each item is finished once.
  uint64_t inline_total = 0;
  for (size_t k = 0; k < req.items.size() && in.op == proto::Op::kGet; k++) {
    const proto::ItemResult& r = reply.results[k];
    if (!r.status.ok()) continue;
    if (r.size != req.items[k].size) return Status::InvalidArgument("gateway reply disagrees with the request");
    inline_total += r.size;
  }
  if (!ring && inline_total > reply.payload.size())
    return Status::InvalidArgument("gateway reply disagrees with the request");
  const uint8_t* inline_data = reply.payload.data();
  for (size_t k = 0; k < req.items.size(); k++) {
    const proto::ItemResult& r = reply.results[k];
    if (in.op == proto::Op::kGet || in.op == proto::Op::kPut) backend_->note_item(r.status);
    if (in.op != proto::Op::kGet || !r.status.ok()) {
      finish(begin + k, r.status, nullptr, 0);
      continue;
    }
    const proto::BatchItem& it = req.items[k];
    const uint8_t* data = ring ? ring->data() + it.offset : inline_data;
    if (!ring) inline_data += r.size;
    finish(begin + k, r.status, data, r.size);
  }
  return Status::Ok();
}

Status RemoteSession::call_in_pieces(const RoundInput& in, size_t begin, const proto::BatchRequest& req,
                                     Deadline deadline, proto::BatchReply* reply, const FinishFn& finish) {
  uint8_t* ring = client_->ring()->data();
  auto* ticket = reinterpret_cast<uint32_t*>(ring + proto::kProgressTicketAt);
  auto* slots = reinterpret_cast<uint32_t*>(ring + proto::kProgressSlotsAt);
  const size_t n = req.items.size(), tracked = std::min(n, proto::kProgressSlots);
  copied_.assign(n, 0);
  for (size_t k = 0; k < tracked; k++) __atomic_store_n(slots + k, 0u, __ATOMIC_RELAXED);
  bool declined = false;  // the batch's future completed: no byte more goes into its buffers
  auto copy_out = [&](size_t k, uint64_t upto) {
    const uint64_t from = copied_[k];
    const uint8_t* src = ring + req.items[k].offset;
    declined = !(*in.deliver)(begin + k, req.items[k].size, [&](uint8_t* dst) {
      std::memcpy(dst + from, src + from, upto - from);
      return true;
    });
    if (!declined) copied_[k] = upto;
  };
  Status s = send_request(req, {}, deadline);  // the slots' zeroes go before the request (the syscall orders them)
  // Its reply is read after the pieces, most of a round trip later: no spin for it (review r13 N2).
  spin_armed_ = false;
  size_t first = 0;  // items before it are copied whole
  auto check_at = Clock::now() + backend_->stall_check_;
  while (s.ok() && !declined) {
    if (const auto now = Clock::now(); now >= check_at) {  // a gateway hung between pieces: logged (H3)
      backend_->check_stall();
      check_at = now + backend_->stall_check_;
    }
    // The ticket before the slots: a piece published after this read bumps it again.
    const uint32_t seen = __atomic_load_n(ticket, __ATOMIC_ACQUIRE);
    bool moved = false;
    for (size_t k = first; k < tracked && !declined; k++) {
      const uint64_t upto = __atomic_load_n(slots + k, __ATOMIC_ACQUIRE);
      if (upto == copied_[k]) continue;
      if (upto < copied_[k] || upto > req.items[k].size) {
        s = Status::InvalidArgument("gateway published progress outside item " + std::to_string(k));
        break;
      }
      if (Clock::now() >= deadline) {  // no piece after the deadline, even while they keep coming
        s = Status::TimedOut("deadline passed while the payload was copied");
        break;
      }
      copy_out(k, upto);
      moved = true;
    }
    while (first < tracked && copied_[first] == req.items[first].size) first++;
    if (moved) client_->heard_now();  // a piece is a sign of life as good as a frame
    if (!s.ok() || declined || moved) continue;
    // Every published byte is out: the rest comes with the reply, or later.
    if (first == tracked || client_->readable()) break;
    if (Clock::now() >= deadline) s = Status::TimedOut("deadline passed while the gateway read the batch");
    if (s.ok()) wait_for_ticket(seen, deadline);
  }
  if (declined) return Status::TimedOut("deadline passed while the payload was copied");
  if (s.ok()) s = read_reply(req, deadline, reply);
  if (!s.ok()) return s;
  for (size_t k = 0; k < n; k++)  // checked whole before any item is finished
    if (reply->results[k].status.ok() && reply->results[k].size != req.items[k].size)
      return Status::InvalidArgument("gateway reply disagrees with the request");
  // A hit's bytes are all in the ring now; the rest of each goes out.
  for (size_t k = 0; k < n; k++) {
    const proto::ItemResult& r = reply->results[k];
    backend_->note_item(r.status);
    if (r.status.ok() && copied_[k] < r.size && !declined) copy_out(k, r.size);
    if (r.status.ok() && copied_[k] < r.size)
      finish(begin + k, Status::NotFound("not delivered"), nullptr, 0);
    else
      finish(begin + k, r.status, nullptr, r.size);
  }
  return Status::Ok();
}

Status RemoteSession::send_request(const proto::BatchRequest& req, std::span<const iovec> payload, Deadline deadline) {
  const auto sending = Clock::now();
  Status s = client_->send(req, payload, deadline);
  if (s.ok()) times.sent(sending);
  sent_op_ = -1;
  spin_armed_ = false;
  if (s.ok() && (req.op == proto::Op::kPut || req.op == proto::Op::kGet)) {
    sent_op_ = req.op == proto::Op::kPut ? 0 : 1;
    spin_armed_ = true;
    sent_at_ = sending;
    sent_bytes_ = 0;
    for (const auto& it : req.items) sent_bytes_ += it.size;
  }
  return s;
}

Status RemoteSession::read_reply(const proto::BatchRequest& req, Deadline deadline, proto::BatchReply* reply,
                                 bool* alive) {
  wait_reply(deadline);
  Status s = client_->await_reply(req, deadline, reply, alive);
  if (s.ok() && !(alive && *alive)) {
    const auto now = Clock::now();
    times.replied(now);
    expect(now);
  }
  if (s.ok()) backend_->note_answered();
  return s;
}

void RemoteSession::wait_reply(Deadline deadline) {
  if (spin_armed_) {
    spin_armed_ = false;
    if (spin_for_reply(deadline)) return;
  }
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline || client_->wait_readable(std::min<Deadline>(deadline, now + backend_->stall_check_))) return;
    backend_->check_stall();
  }
}

bool RemoteSession::spin_for_reply(Deadline deadline) {
  const auto spin = backend_->opts_.reply_spin;
  if (spin.count() <= 0 || sent_op_ < 0) return false;
  const Expected& e = expected_[sent_op_];
  if (e.bytes != sent_bytes_ || e.low_ns <= 0) return false;
  const auto from = sent_at_ + std::chrono::nanoseconds(e.low_ns) -
                    std::max<std::chrono::nanoseconds>(kReplySpinLead, std::chrono::nanoseconds(e.low_ns / 32));
  // A request expected to take longer than a stall check: the spin would gain it little, and the sleep
  // before it would skip a look at the stall.
  if (from - Clock::now() > backend_->stall_check_) return false;
  SpinRecord& record = spin_record_[sent_op_];
  if (!record.due()) return false;
  if (!backend_->reply_load_.allows(backend_->connections_.load(std::memory_order_relaxed),
                                    backend_->reply_spinning_.load(std::memory_order_relaxed)))
    return false;
  if (!slack_set_) {  // the sleep to `from` wakes within a microsecond (50 us otherwise)
    slack_set_ = true;
    ::prctl(PR_SET_TIMERSLACK, kReplySpinTimerSlackNs, 0, 0, 0);
  }
  // The reply (or a hang-up) there before the spin's start: no spin (review r13 N2: counted as one).
  if (client_->sleep_readable(std::min<Deadline>(from, deadline))) return true;
  if (Clock::now() >= deadline) return false;
  backend_->reply_spinning_.fetch_add(1, std::memory_order_relaxed);
  const short ev = client_->spin_readable(std::min<Deadline>(from + spin, deadline));
  backend_->reply_spinning_.fetch_sub(1, std::memory_order_relaxed);
  const bool hit = ev & POLLIN;
  times.reply_spins++;
  if (hit) times.reply_spin_hits++;
  record.note(hit);
  return ev != 0;
}

void RemoteSession::expect(Clock::time_point replied) {
  if (sent_op_ < 0) return;
  Expected& e = expected_[sent_op_];
  const int64_t took = std::chrono::duration_cast<std::chrono::nanoseconds>(replied - sent_at_).count();
  if (e.bytes != sent_bytes_ || e.low_ns <= 0) {
    e.bytes = sent_bytes_;
    e.low_ns = took;
  } else {
    e.low_ns = took < e.low_ns ? took : e.low_ns + (took - e.low_ns) / 8;
  }
  sent_op_ = -1;
}

void RemoteSession::wait_for_ticket(uint32_t seen, Deadline deadline) {
  uint32_t* ticket = reinterpret_cast<uint32_t*>(client_->ring()->data() + proto::kProgressTicketAt);
  uint32_t* waiting = reinterpret_cast<uint32_t*>(client_->ring()->data() + proto::kProgressWaitingAt);
  // The next piece is often a copy's time away: spin that long first.
  const auto spin_until = Clock::now() + kPieceSpin;
  do {
    for (int i = 0; i < 32; i++) {
      if (__atomic_load_n(ticket, __ATOMIC_ACQUIRE) != seen) return;
      cpu_relax();
    }
  } while (Clock::now() < spin_until);
  auto left = std::min<Clock::duration>(deadline - Clock::now(), kPieceSleep);
  if (left <= Clock::duration::zero()) return;
  // Sequentially consistent against the gateway's bump-then-look: either it
  // sees us waiting and wakes us, or we see its bump and do not sleep.
  __atomic_store_n(waiting, 1u, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(ticket, __ATOMIC_SEQ_CST) == seen) {
    timespec ts{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(left).count())};
    ::syscall(SYS_futex, ticket, FUTEX_WAIT, seen, &ts, nullptr, 0);  // shared memory: not FUTEX_PRIVATE
  }
  __atomic_store_n(waiting, 0u, __ATOMIC_RELAXED);
}

// The test hooks read once, at construction (the Connector built on this
// backend logs those set).
RemoteBackend::RemoteBackend(GatewayClientOptions opts) : RemoteBackend(std::move(opts), read_test_hooks()) {}

RemoteBackend::RemoteBackend(GatewayClientOptions opts, const TestHooks& hooks)
    : opts_([&] {
        opts.test_yama_ptrace_scope = hooks.yama_ptrace_scope;
        if (hooks.idle_check_ms >= 0) opts.idle_check = milliseconds(hooks.idle_check_ms);
        return std::move(opts);
      }()),
      stall_ns_(std::max<int64_t>(1, opts_.stall_after.count())),
      stall_check_(hooks.stall_check_ms > 0 ? milliseconds(hooks.stall_check_ms) : kStallCheck),
      connect_timeout_(opts_.connect_timeout),
      max_backoff_(hooks.max_backoff_ms > 0 ? milliseconds(hooks.max_backoff_ms) : kMaxBackoff),
      idle_look_(hooks.idle_look_ms > 0 ? milliseconds(hooks.idle_look_ms) : kIdleLook),
      stall_log_interval_ns_(std::chrono::nanoseconds(hooks.stall_log_interval_ms >= 0
                                                          ? milliseconds(hooks.stall_log_interval_ms)
                                                          : kStallLogInterval)
                                 .count()) {
  test_put_delay_ = milliseconds(hooks.put_copy_delay_ms);
  reply_load_.cpus = hooks.client_cpus > 0 ? hooks.client_cpus : PiecePool::usable_cpus(hooks.cpu_max_file);
  if (!hooks.loadavg_file.empty()) reply_load_.path = hooks.loadavg_file;
  if (hooks.spin_load_every_ms >= 0) reply_load_.every_ns = int64_t{hooks.spin_load_every_ms} * 1'000'000;
}

std::unique_ptr<BackendSession> RemoteBackend::new_session() { return std::make_unique<RemoteSession>(this); }

milliseconds RemoteBackend::next_backoff(milliseconds prev, bool token_refused) const {
  return token_refused ? max_backoff_ : std::clamp(prev * 2, std::min(kFirstBackoff, max_backoff_), max_backoff_);
}

RemoteBackend::~RemoteBackend() {
  {
    std::lock_guard<std::mutex> l(mu_);
    interrupted_ = true;
  }
  reconnect_cv_.notify_all();
  if (reconnect_thread_.joinable()) reconnect_thread_.join();
  drop(&spare_);
}

Status RemoteBackend::connect(proto::Deadline deadline, std::unique_ptr<GatewayClient>* out, bool own_bound) {
  std::unique_ptr<GatewayClient> spare;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (interrupted_) return Status::Closed("connector closed");
    spare = std::move(spare_);
  }
  if (spare && !spare->closed_while_idle()) {
    ADP_DEBUG("%s: a session takes the connection the background reconnect made", describe().c_str());
    spare->held_idle();  // made by the reconnect thread, idle since (used_before())
    *out = std::move(spare);
    return Status::Ok();
  }
  if (spare) {  // the gateway closed it meanwhile (gone again, or its idle timeout): this session connects anew
    ADP_DEBUG("%s: the background reconnect's connection was closed by the gateway meanwhile", describe().c_str());
    drop(&spare);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    session_try_ns_ = steady_ns();
  }
  return connect_new(deadline, out, own_bound);
}

Status RemoteBackend::connect_new(proto::Deadline deadline, std::unique_ptr<GatewayClient>* out, bool own_bound) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (interrupted_) return Status::Closed("connector closed");
  }
  std::unique_ptr<GatewayClient> c;
  Status s = GatewayClient::Connect(opts_, deadline, &c, this);
  if (!s.ok()) {
    if (!closing()) return own_bound ? bound_reached(s) : s;
    const std::string why = s.code() == Status::Code::kClosed ? "" : " (" + log_safe(s.message()) + ")";
    ADP_INFO("%s: a connect in progress was abandoned: the connector is closing%s", describe().c_str(), why.c_str());
    return Status::Closed("connector closed");
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (interrupted_) return Status::Closed("connector closed");
    connects_++;
    idle_probing_ = false;  // a connection is open: the looks watch it (all_closed_locked)
    live_.insert(c.get());
    connections_.store(static_cast<int>(live_.size()), std::memory_order_relaxed);
  }
  // In live_ from here: an exception (its log lines' text) drops it, never leaves it freed there (session 26).
  try {
    note_connected(*c);
  } catch (...) {
    drop(&c);
    throw;
  }
  *out = std::move(c);
  return Status::Ok();
}

void RemoteBackend::note_connected(const GatewayClient& cl) {
  const GatewayClient* c = &cl;
  if (!c->process_refusal().empty() && !process_refusal_logged_.exchange(true))
    ADP_INFO(
        "%s: the gateway does not write loads into this process's memory nor read stores from it (%s): they go "
        "through the ring. Logged once.",
        describe().c_str(), log_safe(c->process_refusal()).c_str());
  token_refused_.store(false);
  unhealable_logged_.store(false);
  {
    std::lock_guard<std::mutex> l(error_mu_);
    gateway_error_.clear();
  }
  start_reconnect();  // from the first connection: it also looks at idle connections (all_closed_locked)
  if (link_.exchange(Link::kUp) != Link::kUp)
    ADP_INFO("%s: connected (%s, %s)", describe().c_str(), log_safe(c->server()).c_str(),
             c->ring() ? ("ring " + std::to_string(c->ring()->size() >> 20) + " MiB per connection").c_str()
                       : "payload inline");
}

void RemoteBackend::drop(std::unique_ptr<GatewayClient>* client) {
  if (!*client) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    live_.erase(client->get());
    connections_.store(static_cast<int>(live_.size()), std::memory_order_relaxed);
    // What it knew of the gateway outlives it: when it last heard from it and
    // a request it gave up on after waiting stall_ns_ with nothing heard.
    const GatewayClient& c = **client;
    c.poll_alive();  // bumps since the last wait slice's look count too (review r10 N2)
    const int64_t since = c.waiting_since_ns(), now = steady_ns();
    dropped_heard_ns_ = std::max(dropped_heard_ns_, c.heard_ns());
    if (since && now - std::max(since, heard_locked()) >= stall_ns_) {
      unanswered_ns_ = now;  // stalled until the gateway is heard from after this
      try {
        (void)stalled_locked(now);  // logs the stall if no stats() saw it yet
      } catch (...) {
        // No memory for its log line (describe()'s text, the message): drop() runs in ~RemoteSession and
        // ~RemoteBackend, where an exception ends the process (std::terminate); the stall is still flagged
        // (unanswered_ns_), the next stats() or batch looks again (gwexc27 item 3).
      }
    }
  }
  client->reset();
}

int64_t RemoteBackend::heard_locked() const {
  int64_t heard = dropped_heard_ns_;
  for (const GatewayClient* c : live_) {
    c->poll_alive();  // r7: a gateway working on a long request bumps its alive word
    heard = std::max(heard, c->heard_ns());
  }
  return heard;
}

void RemoteBackend::check_stall() const {
  std::lock_guard<std::mutex> l(mu_);
  (void)stalled_locked(steady_ns());  // logs a change (once each)
}

bool RemoteBackend::stalled_locked(int64_t now_ns) const {
  const int64_t heard = heard_locked();
  int64_t oldest = 0;
  for (const GatewayClient* c : live_) {
    const int64_t since = c->waiting_since_ns();
    if (since && (!oldest || since < oldest)) oldest = since;
  }
  // Silence counts from the later of the wait's start and the last sign of
  // life: a gateway that sent pieces of a load and then hung is stalled too.
  const bool stalled = unanswered_ns_ > heard || (oldest && now_ns - std::max(oldest, heard) >= stall_ns_);
  if (stalled != stall_logged_) {
    stall_logged_ = stalled;
    stall_flagged_.store(stalled, std::memory_order_relaxed);
    if (stalled) {
      stall_started_ns_ = now_ns;
      stall_warned_ = now_ns >= stall_log_next_ns_;
      if (!stall_warned_) {
        stalls_not_logged_++;
      } else {
        char others[160] = "";
        if (stalls_not_logged_)
          std::snprintf(others, sizeof others,
                        " [%llu stall%s not logged since the last one logged %.0f s ago, %.1f s in all]",
                        static_cast<unsigned long long>(stalls_not_logged_), stalls_not_logged_ == 1 ? "" : "s",
                        (now_ns - stall_warned_ns_) / 1e9, stalls_not_logged_ns_ / 1e9);
        ADP_WARN(
            "%s: a request waited %lld ms with nothing heard from the gateway (stalled: hung or overloaded); "
            "requests fail by their deadlines until it answers%s",
            describe().c_str(), static_cast<long long>(stall_ns_ / 1000000), others);
        stall_log_next_ns_ = now_ns + stall_log_interval_ns_;
        stall_warned_ns_ = now_ns;
        stalls_not_logged_ = 0;
        stalls_not_logged_ns_ = 0;
      }
    } else if (stall_warned_) {
      ADP_INFO("%s: the gateway answers again, %.1f s after the stall was seen", describe().c_str(),
               (now_ns - stall_started_ns_) / 1e9);
    } else {
      stalls_not_logged_ns_ += now_ns - stall_started_ns_;
    }
  }
  return stalled;
}

void RemoteBackend::note_item(const Status& st) {
  if (card_io_error(st)) {
    std::lock_guard<std::mutex> l(card_mu_);
    if (card_failing_.error().started)
      ADP_WARN("%s: the gateway's card fails I/O: %s", describe().c_str(), log_safe(st.message()).c_str());
    card_error_ = st.message();
  } else if (st.ok() && card_failing_.failing()) {
    std::lock_guard<std::mutex> l(card_mu_);
    if (const FailingHold::Change c = card_failing_.success(); c.ended) {
      ADP_INFO(
          "%s: the gateway's card works again (%llu I/O errors in %.1f s; failing until one succeeded %lld ms "
          "after the last)",
          describe().c_str(), static_cast<unsigned long long>(c.errors), c.seconds,
          static_cast<long long>(failing_hold_ms().load(std::memory_order_relaxed)));
      card_error_.clear();
    }
  }
}

bool RemoteBackend::token_refusal(const Status& why) {
  return why.message().find(proto::kTokenRefused) != std::string::npos;
}

bool RemoteBackend::full_refusal(const Status& why) {
  const std::string& m = why.message();
  return m.find(proto::kTooManyLocalClients) != std::string::npos ||
         m.find(proto::kTooManyTcpClients) != std::string::npos ||
         m.find(proto::kTooManyTcpHandshakes) != std::string::npos;
}

std::string RemoteBackend::unhealable_fix(const Status& why) {
  const std::string& m = why.message();
  if (m.find(proto::kRingTooLarge) != std::string::npos && m.find("--max-ring-mb") != std::string::npos)
    return "a retry cannot heal this: fix ring_mb (or the gateway's --max-ring-mb) and restart";
  if (m.find(proto::kOtherVersion) != std::string::npos)
    return "a retry cannot heal this: run the connector and the gateway of one lmcache-adp release (this one "
           "speaks protocol version " +
           std::to_string(proto::kProtocolVersion) + ") and restart";
  return "";
}

void RemoteBackend::note_down(const Status& why) {
  const bool refused = token_refusal(why);
  const std::string fix = refused ? "" : unhealable_fix(why);
  {
    std::lock_guard<std::mutex> l(error_mu_);
    // Printable ASCII (a peer's text): a stats dict's str, and /health's JSON, take it as it is.
    gateway_error_ = log_safe(why.message(), 512) + (fix.empty() ? "" : "; " + fix);
  }
  if (refused && !token_refused_.exchange(true))
    ADP_ERROR(
        "%s: the gateway refused this connector's token (%s): adapter_params['token_file'] does not hold the "
        "token of the gateway's --token-file. That does not heal by itself: put the gateway's token in "
        "token_file and restart this process. Until then every request fails (the connector tries again at most "
        "every %lld ms, in the background while idle)",
        describe().c_str(), log_safe(why.message()).c_str(), static_cast<long long>(kMaxBackoff.count()));
  const bool was_down = link_.exchange(Link::kDown) == Link::kDown;
  if (!was_down) probe_unsupported_.store(false);  // the gateway that comes back may know status queries (r10)
  if (!fix.empty()) {
    // Not "until it is back": the gateway is up, and refuses every connect until one side is changed (audit 15).
    if (!unhealable_logged_.exchange(true))
      ADP_WARN(
          "%s: %s; its requests fail until a connect succeeds (it tries again with back-off, in the background "
          "while idle, every %lld ms at the longest), and %s",
          describe().c_str(), log_safe(why.message()).c_str(), static_cast<long long>(kMaxBackoff.count()),
          fix.c_str());
  } else if (!was_down && !refused) {
    ADP_WARN(
        "%s: %s; its requests fail until it is back (its next requests reconnect, with back-off; an idle connector "
        "retries in the background, every %lld ms at the longest)",
        describe().c_str(), log_safe(why.message()).c_str(), static_cast<long long>(kMaxBackoff.count()));
  }
  start_reconnect();
}

bool RemoteBackend::all_closed_locked() const {
  for (const GatewayClient* c : live_)
    if (c->waiting_since_ns() || !c->peer_closed()) return false;
  return !live_.empty() || idle_probing_;
}

Status RemoteBackend::probe(bool* as_query) {
  GatewayClientOptions o = opts_;
  o.status_query = true;
  std::unique_ptr<GatewayClient> c;
  Status s = GatewayClient::Connect(o, Clock::now() + connect_timeout_, &c, this);
  if (!s.ok() && closing()) return Status::Closed("connector closed");
  *as_query = s.ok() && c->status_query();
  return bound_reached(s);  // c, if any, closed here: the gateway logs the query's end at DEBUG
}

Status RemoteBackend::bound_reached(const Status& s) const {
  if (s.code() != Status::Code::kTimedOut) return s;
  return Status::TimedOut(
      s.message() + " (its connect's bound, connect_timeout_ms: " + std::to_string(connect_timeout_.count()) + " ms)");
}

void RemoteBackend::start_reconnect() {
  std::call_once(reconnect_once_, [this] {
    try {
      reconnect_thread_ = std::thread(&RemoteBackend::reconnect_loop, this);
    } catch (const std::exception& e) {
      // No thread (std::system_error: a pids limit, memory for its stack; std::bad_alloc: its state): the next batch
      // reconnects, as before. Not let through: from connect_new it left a connection freed in live_, on the
      // start-up connect's thread it ended the process.
      ADP_WARN("%s: no background reconnect (%s): an idle connector stays unreachable until its next batch",
               describe().c_str(), e.what());
    }
  });
  reconnect_cv_.notify_all();
}

void RemoteBackend::reconnect_loop() {
  set_thread_name("adp-reconnect");
  const auto ns = [](milliseconds d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); };
  milliseconds backoff{0};  // 0: no outage seen by this loop yet
  int64_t try_at = 0;
  std::unique_lock<std::mutex> l(mu_);
  while (!interrupted_) {
    // One look or attempt; an exception out of it (std::bad_alloc: a connect's, a log line's) is a failed attempt:
    // logged, then the next after the back-off (try_at; a look while the link is up waits idle_look_ first)
    // (session 26: it ended the process, std::terminate). A connection it made is in spare_ or dropped by then:
    // connect_new drops one it cannot note, and nothing after a connect's success throws in reconnect_step.
    try {
      reconnect_step(l, backoff, try_at);
    } catch (const std::exception& e) {
      if (!l.owns_lock()) l.lock();
      backoff = next_backoff(backoff, false);
      try_at = steady_ns() + ns(backoff);
      try {
        ADP_ERROR("%s: the background reconnect's attempt failed on an exception (%s): tried again in %lld ms",
                  describe().c_str(),
                  dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory: std::bad_alloc" : e.what(),
                  static_cast<long long>(backoff.count()));
      } catch (...) {
      }
    }
  }
}

void RemoteBackend::reconnect_step(std::unique_lock<std::mutex>& l, milliseconds& backoff, int64_t& try_at) {
  const auto ns = [](milliseconds d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); };
  if (link_.load() == Link::kDown && spare_) {
    // Down again before a session took it: made before this outage, it proves nothing now (and, kept, it would
    // hold this loop off while the connector stays unreachable).
    std::unique_ptr<GatewayClient> old = std::move(spare_);
    l.unlock();
    drop(&old);
    l.lock();
    return;
  }
  if (link_.load() != Link::kDown) {
    // Reachable (its connection, if any, not taken yet). note_down wakes it; the timeout only bounds a wake-up
    // missed between this look and the wait (link_ is set without mu_), and paces the look at idle connections.
    backoff = milliseconds{0};
    reconnect_cv_.wait_for(l, idle_look_);
    if (interrupted_ || link_.load() != Link::kUp || !all_closed_locked()) return;
    // Every connection of this connector, none waiting for a reply, was closed by the gateway (audit 15 item 22:
    // an idle connector read reachable, /health 200, while its gateway was stopped, until its next batch), or
    // none is left since the last look's status query. Gone, or closing idle connections (--idle-timeout-s): a
    // status query tells which, holding no --max-clients slot and no ring (review r15 N13). It fails: the outage
    // (WARNING, 503), and the loop below reconnects; it is answered: no outage, nothing kept, asked again at the
    // next look. A spare of before is one of those closed: dropped (kept, it would make this look true every
    // time).
    std::unique_ptr<GatewayClient> old = std::move(spare_);
    l.unlock();
    drop(&old);
    if (!probe_unsupported_.load()) {
      bool as_query = false;
      const Status s = probe(&as_query);
      // Refused for being full (--max-clients clients and the status-query reserve taken, or --max-tcp-clients):
      // an answer, so the gateway is up (brief admission item 2: it read as an outage, WARNING and 503). A batch
      // would be refused as well, and says so when one comes.
      const bool full = !s.ok() && full_refusal(s);
      if (full && !full_logged_.exchange(true))
        ADP_INFO(
            "%s: the gateway closed this idle connector's connections and is full (%s): it is up; asked again "
            "every %lld ms until the next batch connects (this line once; the next refusals at DEBUG)",
            describe().c_str(), log_safe(s.message()).c_str(), static_cast<long long>(idle_look_.count()));
      else if (full)
        ADP_DEBUG("%s: idle status query refused: %s", describe().c_str(), log_safe(s.message()).c_str());
      if (!s.ok() && !full && !closing())
        note_down(Status::Unavailable("the gateway closed this connector's connections: " + s.message()));
      if (!s.ok() || as_query) {
        l.lock();
        if (s.ok() && !idle_probing_)
          ADP_DEBUG(
              "%s: the gateway closed this idle connector's connections and answers a status query: "
              "asked again every %lld ms until the next batch connects",
              describe().c_str(), static_cast<long long>(idle_look_.count()));
        if ((s.ok() || full) && !interrupted_) idle_probing_ = true;
        return;
      }
      // A gateway older than r10 served it as a client's connection (logged connected and gone at INFO): a
      // query a second would fill its log. Connect as before session sixteen instead, the connection kept as the
      // spare.
      probe_unsupported_.store(true);
      ADP_INFO(
          "%s: the gateway does not know status queries (protocol r9 or older): while idle this connector keeps "
          "one connection to it, to see it stop, and connects again after each idle close (--idle-timeout-s)",
          describe().c_str());
    }
    std::unique_ptr<GatewayClient> c;
    const Status s = connect_new(Clock::now() + connect_timeout_, &c);
    if (!s.ok() && !closing())
      note_down(Status::Unavailable("the gateway closed this connector's connections: " + s.message()));
    l.lock();
    if (s.ok() && !spare_ && !interrupted_) {
      spare_ = std::move(c);
    } else if (c) {
      l.unlock();
      drop(&c);
      l.lock();
    }
    return;
  }
  if (backoff.count() == 0) {
    backoff = next_backoff(milliseconds{0}, token_refused_.load());
    try_at = steady_ns() + ns(backoff);
  }
  // A session that began a connect of its own within the back-off has traffic: it reconnects by itself.
  try_at = std::max(try_at, session_try_ns_ + ns(backoff));
  if (const int64_t now = steady_ns(); now < try_at) {
    reconnect_cv_.wait_for(l, std::chrono::nanoseconds(try_at - now));
    return;
  }
  const uint64_t before = connects_;
  l.unlock();
  std::unique_ptr<GatewayClient> c;
  const Status s = connect_new(Clock::now() + connect_timeout_, &c);
  if (!s.ok() && !closing()) {
    note_down(s);  // the link is down already: logs only a token refused anew (its ERROR, once)
    ADP_DEBUG("%s: the background reconnect failed (%s)", describe().c_str(), log_safe(s.message()).c_str());
  }
  l.lock();
  if (s.ok() && connects_ == before + 1 && !interrupted_) {
    spare_ = std::move(c);  // the link is up (connect_new logged "connected")
  } else if (c) {
    // A session's own connect succeeded while this one was made: one connection each is enough.
    l.unlock();
    drop(&c);
    l.lock();
  }
  if (!s.ok()) {
    backoff = next_backoff(backoff, token_refusal(s));
    try_at = steady_ns() + ns(backoff);
  }
}

void RemoteBackend::note_start_failure(const Status& why, uint64_t connects_before) {
  std::lock_guard<std::mutex> l(mu_);  // against a connect's success (connects_): the link it logged up stays up
  if (interrupted_ || connects_ != connects_before) {
    ADP_DEBUG("%s: the start-up connect failed (%s), but %s", describe().c_str(), log_safe(why.message()).c_str(),
              interrupted_ ? "the connector is closing" : "a connection was made since it began");
    return;
  }
  note_down(why);
}

void RemoteBackend::hint_ring() {
  if (ring_hinted_.exchange(true, std::memory_order_relaxed)) return;
  ADP_INFO(
      "%s: LMCache's buffers are not in a shared memory file, so their bytes go through the ring: one more copy "
      "of every byte each way, which on a memory-speed card halves loads. Start "
      "`lmcache server` with --shm-name to put its L1 pool in /dev/shm: the gateway then loads into and stores "
      "from it in place (docs/protocol.md, \"Segments\"). Logged once.",
      describe().c_str());
}

bool RemoteBackend::closing() {
  std::lock_guard<std::mutex> l(mu_);
  return interrupted_;
}

void RemoteBackend::interrupt() {
  std::lock_guard<std::mutex> l(mu_);
  interrupted_ = true;
  for (const GatewayClient* c : live_) c->interrupt();
  for (int fd : connecting_) ::shutdown(fd, SHUT_RDWR);  // unwatched before closed: still this socket
  reconnect_cv_.notify_all();
}

bool RemoteBackend::watch(int fd) {
  std::lock_guard<std::mutex> l(mu_);
  if (interrupted_) return false;
  connecting_.insert(fd);
  return true;
}

bool RemoteBackend::cancelled() { return closing(); }

void RemoteBackend::unwatch(int fd) {
  std::lock_guard<std::mutex> l(mu_);
  connecting_.erase(fd);
}

SegmentSpan RemoteBackend::find_segment(const uint8_t* p, size_t len) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> l(seg_mu_);
  auto lookup = [&]() -> const MappedRange* {  // the cached mapping holding p
    auto it = ranges_.upper_bound(lo);
    if (it == ranges_.begin()) return nullptr;
    --it;
    return lo < it->second.hi ? &it->second : nullptr;
  };
  const MappedRange* r = lookup();
  auto now = std::chrono::steady_clock::now();
  // An address no cached mapping holds is newer than the last read: read
  // again. One known to be anonymous: again at most once a second (it may
  // have been replaced by a file mapping; till then it uses the ring).
  if (!r || (!r->file && now - maps_read_at_ >= std::chrono::seconds(1))) {
    maps_read_at_ = now;
    // Files already open are kept (by device and inode), so their ids on
    // live connections stay valid.
    std::map<std::pair<dev_t, ino_t>, std::shared_ptr<SegmentFile>> open;
    for (auto& [start, m] : ranges_)
      if (m.file) {
        struct stat st;
        if (::fstat(m.file->fd, &st) == 0) open[{st.st_dev, st.st_ino}] = m.file;
      }
    ranges_.clear();
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      unsigned long long start, end, off, ino;
      unsigned maj, mnr;
      char perms[8];
      int path_at = 0;
      if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &off, &maj, &mnr, &ino,
                      &path_at) < 7)
        continue;
      MappedRange m{static_cast<uintptr_t>(end), off, nullptr};
      std::string path = path_at > 0 ? line.substr(path_at) : "";
      // Shared, writable mappings of a file in /dev/shm (not deleted: it is opened by name).
      if (std::string_view(perms).substr(0, 2) == "rw" && perms[3] == 's' && path.rfind("/dev/shm/", 0) == 0) {
        auto key = std::make_pair(static_cast<dev_t>(makedev(maj, mnr)), static_cast<ino_t>(ino));
        auto f = open.find(key);
        if (f != open.end()) {
          m.file = f->second;
        } else {
          int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
          struct stat st;
          if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == key.first &&
              st.st_ino == key.second && st.st_size > 0) {
            m.file = std::make_shared<SegmentFile>();
            m.file->fd = fd;
            m.file->bytes = static_cast<uint64_t>(st.st_size);
            m.file->dev = st.st_dev;
            m.file->ino = st.st_ino;
            open[key] = m.file;
          } else if (fd >= 0) {
            ::close(fd);
          }
        }
      }
      ranges_[static_cast<uintptr_t>(start)] = std::move(m);
    }
    r = lookup();
  }
  if (!r || !r->file || len > r->hi - lo) return {};
  auto it = std::prev(ranges_.upper_bound(lo));
  uint64_t at = it->second.file_offset + (lo - it->first);
  if (at + len > r->file->bytes) return {};
  return {r->file, at};
}

void RemoteBackend::forget_segments() {
  std::lock_guard<std::mutex> l(seg_mu_);
  ranges_.clear();
  maps_read_at_ = {};
}

StoreStats RemoteBackend::stats() const {
  StoreStats s;
  counters_.copy_to(&s);
  s.process_loads = process_loads_.load(std::memory_order_relaxed);
  s.process_stores = process_stores_.load(std::memory_order_relaxed);
  s.process_stores_over_limit = process_stores_over_limit_.load(std::memory_order_relaxed);
  s.on_gateway = true;
  s.gateway_reachable = link_.load() != Link::kDown;
  s.gateway_token_refused = token_refused_.load();
  s.gateway_reconnects = reconnects_.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> l(error_mu_);
    s.gateway_error = gateway_error_;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    s.gateway_stalled = stalled_locked(steady_ns());
  }
  std::lock_guard<std::mutex> l(card_mu_);
  s.gateway_card_healthy = !card_failing_.failing();
  s.gateway_card_error = card_error_;
  return s;
}

}  // namespace adp
