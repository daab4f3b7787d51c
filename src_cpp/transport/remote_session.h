// SPDX-License-Identifier: Apache-2.0
// What RemoteBackend's own files share (remote_backend.cc, remote_session.cc,
// remote_in_place.cc, remote_reply_wait.cc) and nothing else includes: the
// worker session (RemoteSession: its class, with the spin record of
// reply_spin_us), what one operation sends (RoundInput, FinishFn) and this
// thread's PROCMAP_QUERY handle (MapQuery, for the in-place path). Which
// file holds which of RemoteSession's definitions: each file's head comment.
#pragma once

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "transport/remote_backend.h"
#include "util/log.h"

namespace adp {

using proto::Clock;
using std::chrono::milliseconds;

// The spin's own record, per op and session (RemoteSession::SpinRecord): once
// fewer than kReplySpinMinHits of its last kReplySpinRecord spins caught the
// reply, it pauses; paused, 1 wait in kReplySpinProbeEvery spins as a probe,
// and a probe that catches its reply ends the pause.
constexpr int kReplySpinRecord = 16;
constexpr int kReplySpinMinHits = 4;
constexpr int kReplySpinProbeEvery = 16;

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
// of the buffer. One per session thread: the proof of a cached mapping before
// each request (check) and RemoteBackend::find_segment's look-up of one
// address (find), in place of a read of the whole of /proc/self/maps.
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
  // off (ADP_TEST_NO_PROCMAP_QUERY): answers as a kernel without the ioctl.
  explicit MapQuery(bool off = false) : fd_(off ? -1 : ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC)) {}
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
  // The mapping holding p (supported() true): false where none does. With
  // `name`, its path as /proc/self/maps shows it (" (deleted)" after an
  // unlinked file's), NUL-terminated, into the caller's buffer: asked only
  // where a file must be opened by name.
  bool find(const uint8_t* p, ProcmapQuery* q, char* name = nullptr, uint32_t name_size = 0) {
    *q = ProcmapQuery{};
    q->size = sizeof *q;
    q->query_addr = reinterpret_cast<uintptr_t>(p);
    q->vma_name_addr = reinterpret_cast<uintptr_t>(name);
    q->vma_name_size = name ? name_size : 0;
    return ::ioctl(fd_, kProcmapQuery, q) == 0;
  }
  // find_segment asks the kernel again about an address cached as no shared
  // memory file once per batch (batch() at its start) and mapping: the last
  // mapping asked about in this batch, [asked_lo_, asked_hi_).
  void batch() { asked_lo_ = asked_hi_ = 0; }
  bool asked(uintptr_t p) const { return asked_lo_ <= p && p < asked_hi_; }
  void note_asked(uintptr_t lo, uintptr_t hi) { asked_lo_ = lo, asked_hi_ = hi; }

 private:
  int fd_;
  bool probed_ = false, works_ = false;
  uintptr_t asked_lo_ = 0, asked_hi_ = 0;
};

class RemoteSession : public BackendSession {
 public:
  explicit RemoteSession(RemoteBackend* backend) : backend_(backend), maps_(backend->test_no_procmap_query_) {}
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
  MapQuery maps_;  // this thread's PROCMAP_QUERY handle (find_segment's, the proof's)
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

}  // namespace adp
