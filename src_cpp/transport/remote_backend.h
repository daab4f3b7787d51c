// SPDX-License-Identifier: Apache-2.0
// RemoteBackend: the connector's work sent to a gateway daemon, over a Unix
// socket (payload through a shared-memory ring per connection) or TCP
// (payload inline, token). Each worker session holds its own connection.
//
// A gateway that is absent or gone never hangs a worker: every wait is
// bounded by the batch's deadline, interrupt() shuts all connections down,
// and a lost connection fails its batch and is re-established on a later
// batch with exponential back-off (state changes logged once, not per
// request). Bytes reach the caller's buffers only through DeliverFn.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "connector/backend.h"
#include "transport/gateway_client.h"
#include "util/failing_hold.h"
#include "util/idle_cpus.h"
#include "util/test_hooks.h"

namespace adp {

// A gateway stall's WARNING is logged at most once per this long per
// connector (the next one says how many stalls were not logged and how long
// they lasted): a gateway that answers only after the stall bound, cycle
// after cycle, logs two lines a minute, not two per cycle (review r10 N1).
inline constexpr std::chrono::milliseconds kStallLogInterval{60000};

// A shared memory file of this process (/dev/shm) that holds load buffers
// (LMCache's L1 pool with --shm-name): registered with the gateway, which
// then reads the card straight into it (protocol r3).
struct SegmentFile {
  int fd = -1;
  uint64_t bytes = 0;
  dev_t dev = 0;
  ino_t ino = 0;
  std::atomic<bool> refused{false};  // a gateway would not map it: use the ring
  // A registration refused for now (protocol r19, proto::kSegmentRetryLater: the gateway's state, not the file's):
  // its buffers use the ring until retry_at_ns (steady clock), the back-off doubling from kSegmentFirstBackoff to
  // kSegmentMaxBackoff while refusals go on (backoff_ms; 0 once one succeeded), the outage logged once (deferred).
  std::atomic<int64_t> retry_at_ns{0};
  std::atomic<int64_t> backoff_ms{0};
  std::atomic<bool> deferred{false};
  ~SegmentFile();
};
inline constexpr std::chrono::milliseconds kSegmentFirstBackoff{1000}, kSegmentMaxBackoff{60000};

// Where a buffer lies in a SegmentFile.
struct SegmentSpan {
  std::shared_ptr<SegmentFile> file;
  uint64_t offset = 0;
};

class MapQuery;

class RemoteBackend : public Backend, private proto::ConnectWatch {
 public:
  explicit RemoteBackend(GatewayClientOptions opts);
  ~RemoteBackend() override;  // ends and joins the reconnect thread
  std::unique_ptr<BackendSession> new_session() override;
  std::string describe() const override { return "gateway " + opts_.endpoint.str(); }
  StoreStats stats() const override;
  void interrupt() override;
  // Whether interrupt() ran: the connector is closing, and a connect it cut
  // short ("connector closed") is not an outage (review r13 S4).
  bool closing();

 private:
  friend class RemoteSession;
  RemoteBackend(GatewayClientOptions opts, const TestHooks& hooks);
  enum class Link { kUnknown, kUp, kDown };
  // Connects a session's client; registered so interrupt() reaches it, and
  // watched while it connects (connecting_), so interrupt() ends the connect
  // and the handshake at once too: close() does not wait out a gateway that
  // accepts but never answers, or a TCP address that drops SYNs, for
  // connect_timeout_ (review r14 S1). A connect so abandoned is logged (INFO)
  // and fails "connector closed". `own_bound`: `deadline` is the connect's own
  // bound (connect_timeout_), not a batch's sooner deadline: a timeout then
  // says so (bound_reached).
  Status connect(proto::Deadline deadline, std::unique_ptr<GatewayClient>* out, bool own_bound = true);
  // A new connection (connect() without the spare), watched.
  Status connect_new(proto::Deadline deadline, std::unique_ptr<GatewayClient>* out, bool own_bound = true);
  // A connect's failure as an operator reads it: a timeout (the connect's own bound reached) names the bound and
  // its parameter, "gateway did not answer in time (its connect's bound, connect_timeout_ms: 300 ms)", so a slow
  // gateway or link is told from a refusal and the knob is named in the WARNING (session 30); else `s` as it is.
  Status bound_reached(const Status& s) const;
  // connect_new's notes of a connection made (in live_ already): its log lines, the link up. May throw (their
  // text): connect_new then drops the connection.
  void note_connected(const GatewayClient& c);
  // The background reconnect (review r14 S2: an idle connector stayed
  // unreachable, /health 503, until LMCache's next batch, so a readiness probe
  // on /health waited for traffic that waited for it). Started at the first
  // connection or outage, on a thread of its own ("adp-reconnect"), ended by
  // interrupt(). While the link is up it looks at the connections every
  // kIdleLook: all of them idle and closed by the gateway (audit 15 item 22:
  // an idle connector did not see its gateway stop), it asks the gateway a
  // status query (probe()): a failure is the outage; an answer (a gateway
  // closing idle connections, --idle-timeout-s; or a refusal for being full,
  // full_refusal: the gateway is up) is no outage, and from then on,
  // while no connection is open (idle_probing_), it asks again every kIdleLook,
  // holding nothing on the gateway between two (review r15 N13: it connected
  // as a client, kept that connection as the spare below, and so held a
  // --max-clients slot and a ring for good, reconnecting at every idle close).
  // A gateway older than r10 takes the query as a client's connection
  // (probe_unsupported_): then it connects as before r16, the connection kept
  // as the spare. While the link is down with no spare connection, it connects
  // once per back-off (kFirstBackoff doubling to kMaxBackoff; a refused token:
  // kMaxBackoff each time), and only while no session has tried a connect of
  // its own within that back-off (the sessions of a connector with traffic
  // reconnect by themselves: it does not race them). Its connection is the
  // spare: the link is up (INFO "connected", gateway_reachable 1, /health
  // 200) and the next session that needs a connection takes it (connect(),
  // counted there as that session's reconnect, once); dropped instead if a
  // session's own connect succeeded while it was made, or if the link went
  // down again before a session took it (then it tries anew).
  void start_reconnect();
  void reconnect_loop();
  // One pass of reconnect_loop (`l` holds mu_ on entry and on a return): a look at the connections while the link
  // is up, or one attempt (or its back-off's wait) while it is down. May throw (std::bad_alloc).
  void reconnect_step(std::unique_lock<std::mutex>& l, std::chrono::milliseconds& backoff, int64_t& try_at);
  // The gateway answers a status query (r10: Hello bit 9 alone, no ring, not a
  // client), watched like a connect; the connection is closed at once.
  // *as_query: the gateway took bit 9 (false: a gateway older than r10 took a
  // client's connection).
  Status probe(bool* as_query);
  // Whether no connection in live_ is open or waiting for a reply: every one
  // idle and closed by the gateway (GatewayClient::peer_closed), one at least,
  // or none left while idle_probing_. mu_ held.
  bool all_closed_locked() const;
  // proto::ConnectWatch, under mu_: connecting_ and interrupted_.
  bool watch(int fd) override;
  bool cancelled() override;
  void unwatch(int fd) override;
  // Closes *client and takes it out of live_. Throws nothing (it runs in ~RemoteSession and ~RemoteBackend): a
  // stall's log line without memory is skipped (session 27).
  void drop(std::unique_ptr<GatewayClient>* client);
  // A failed connect or a dropped connection: logs the link going down once
  // (WARNING), a refused token once until a connect succeeds (ERROR: it does
  // not heal by itself; stats: gateway_token_refused), and another refusal no
  // retry heals (unhealable_fix) once until a connect succeeds, its WARNING
  // ending in the fix even while the link was down already. Keeps `why` (and
  // that fix) as gateway_error until a connect succeeds.
  void note_down(const Status& why);
  // The start-up connect's failure (RemoteSession::start_connect): note_down,
  // unless the connector is closing or a connection was made since it began
  // (connects() was `connects_before`): a batch's own, which found the gateway
  // answering, so this failure says nothing newer.
  void note_start_failure(const Status& why, uint64_t connects_before);
  // The wait before the next connect after `prev` (0: the first failure): doubling from kFirstBackoff to
  // max_backoff_, max_backoff_ at once for a refused token (no retry soon can fix it). One rule for a session's
  // back-off and the background reconnect's.
  std::chrono::milliseconds next_backoff(std::chrono::milliseconds prev, bool token_refused) const;
  uint64_t connects() {
    std::lock_guard<std::mutex> l(mu_);
    return connects_;
  }
  static bool token_refusal(const Status& why);
  // A refusal for being full (proto::kTooManyLocalClients, kTooManyTcpClients, kTooManyTcpHandshakes): the
  // gateway is up and answered.
  static bool full_refusal(const Status& why);
  // What fixes a refusal no retry heals but a token's (audit 15 item 18: a
  // ring above the gateway's --max-ring-mb, another protocol version), in the
  // words of its WARNING and of gateway_error; empty for any other failure.
  static std::string unhealable_fix(const Status& why);
  // Whether the gateway is stalled (stats: gateway_stalled): a request has
  // waited stall_ns_ with nothing heard from the gateway on any of this
  // connector's connections since it was sent or since the last thing heard,
  // whichever is later (it is still waiting, or was given up by its deadline
  // after waiting that long), until the gateway is next heard from (a reply,
  // a published piece, a new connection's handshake). Only what the
  // connections track already: no probe is sent. Logs its start (WARNING, at
  // most once per kStallLogInterval) and the end of a stall whose start was
  // logged (INFO, with how long it lasted).
  bool stalled_locked(int64_t now_ns) const;  // mu_ held
  // A request's wait looks at the stall (stalled_locked, so its start and
  // end are logged once each with no stats() call); takes mu_.
  void check_stall() const;
  // After a reply was read: while a stall is logged, looks again (check_stall),
  // so its end is logged when the gateway answers, not at the next wait or
  // scrape. One relaxed load otherwise.
  void note_answered() const {
    if (stall_flagged_.load(std::memory_order_relaxed)) check_stall();
  }
  int64_t heard_locked() const;  // mu_ held: when the gateway was last heard from, any connection
  // A load's or store's result as the gateway's reply gave it (stats:
  // gateway_card_healthy): an I/O error on the gateway's card makes it
  // failing until a load hits or a store succeeds.
  void note_item(const Status& st);
  // The segment holding [p, p + len) in one mapping (cached by mapping).
  // Null file: not in a shared memory file (anonymous memory: the ring).
  // Where the kernel has PROCMAP_QUERY, the mapping of p alone is asked of
  // it with the session's handle, outside seg_mu_: when no cached mapping
  // holds p, and for one cached as no shared memory file once per batch
  // (maps.batch()). Elsewhere find_segment_by_scan.
  SegmentSpan find_segment(const uint8_t* p, size_t len, MapQuery& maps);
  // The same from a read of the whole of /proc/self/maps, under seg_mu_
  // (kernels before 6.11, ADP_TEST_NO_PROCMAP_QUERY): read again when p lies
  // in no cached mapping, and at most once a second for one cached as no
  // shared memory file.
  SegmentSpan find_segment_by_scan(const uint8_t* p, size_t len);
  void forget_segments();  // a cached mapping proved stale
  // Once per connector: buffers in anonymous memory take the ring; says how to avoid it.
  void hint_ring();

  const GatewayClientOptions opts_;
  mutable std::mutex mu_;
  std::set<const GatewayClient*> live_;
  std::set<int> connecting_;         // mu_: sockets of connects in progress (interrupt() shuts them down)
  std::atomic<int> connections_{0};  // live_.size(), read without mu_ (reply_spin's load rule)
  // reply_spin_us's load rule (util/idle_cpus.h: PiecePool::usable_cpus, or
  // ADP_TEST_CLIENT_CPUS; the load file and interval of the test hooks), and
  // the workers spinning for a reply now (runnable because they spin: not
  // held against the rule).
  IdleCpus reply_load_;
  std::atomic<int> reply_spinning_{0};
  const int64_t stall_ns_;  // adapter_params gateway_stall_s (5 s)
  // A request's wait looks at the stall this often (kStallCheck;
  // ADP_TEST_STALL_CHECK_MS: a test that makes it longer than its request
  // leaves drop() the only look at the alive word of a wait ended by a
  // hang-up; a wait_reply that reaches its deadline looks once more there).
  const std::chrono::milliseconds stall_check_;
  // A connect's bound, its handshake included: adapter_params connect_timeout_ms (GatewayClientOptions::
  // connect_timeout, 2000 ms by default), for every connect: the start-up connect's, a batch's (its deadline if
  // sooner), the background reconnect's and the idle status query's (probe()). Also the outage bound of a
  // session's connects cut short in a row by their batches' deadlines (RemoteSession::connected). Session 30:
  // it was kConnectTimeout (2 s), fixed but for a test hook that did not reach probe().
  const std::chrono::milliseconds connect_timeout_;
  // The longest back-off, and a refused token's (kMaxBackoff; ADP_TEST_MAX_BACKOFF_MS: a test that reaches it
  // sooner, or keeps a session in its back-off for its whole run).
  const std::chrono::milliseconds max_backoff_;
  // How often the background reconnect looks at an idle connector's connections (kIdleLook; ADP_TEST_IDLE_LOOK_MS:
  // a test that restarts a gateway and means a batch, not that look, to meet the closed connection).
  const std::chrono::milliseconds idle_look_;
  int64_t dropped_heard_ns_ = 0;       // mu_: the latest heard_ns() of the connections dropped
  int64_t unanswered_ns_ = 0;          // mu_: when a request was last given up after stall_ns_ with nothing heard
  mutable bool stall_logged_ = false;  // mu_: the last state logged
  mutable std::atomic<bool> stall_flagged_{false};  // stall_logged_, read without mu_ (note_answered)
  // mu_: the stall logs' rate limit (review r10 N1).
  const int64_t stall_log_interval_ns_;       // kStallLogInterval (ADP_TEST_STALL_LOG_INTERVAL_MS)
  mutable int64_t stall_started_ns_ = 0;      // when the current (or last) stall was seen
  mutable bool stall_warned_ = false;         // its start was logged (so its end is)
  mutable int64_t stall_log_next_ns_ = 0;     // no stall WARNING before this
  mutable int64_t stall_warned_ns_ = 0;       // when the last one was logged
  mutable uint64_t stalls_not_logged_ = 0;    // stalls since it, not logged
  mutable int64_t stalls_not_logged_ns_ = 0;  // how long those lasted, in all
  FailingHold card_failing_;                  // review r10 R2: held failing kFailingHold past its last error
  mutable std::mutex card_mu_;
  std::string card_error_;  // card_mu_: the gateway's message of the I/O error
  bool interrupted_ = false;
  // The background reconnect (start_reconnect); mu_ for the rest.
  std::once_flag reconnect_once_;
  std::thread reconnect_thread_;
  std::condition_variable reconnect_cv_;        // interrupted_, link_ down, or session_try_ns_ moved
  std::unique_ptr<GatewayClient> spare_;        // its connection, not taken yet (in live_)
  int64_t session_try_ns_ = 0;                  // when a session last began a connect of its own
  uint64_t connects_ = 0;                       // mu_: connections made, in all (note_start_failure)
  bool idle_probing_ = false;                   // mu_: the last look's status query was answered, no connect since
  std::atomic<bool> probe_unsupported_{false};  // a gateway older than r10 answered it as a client, until an outage
  std::atomic<bool> full_logged_{false};        // an idle status query refused as full logged at INFO (once)
  std::atomic<Link> link_{Link::kUnknown};
  std::atomic<bool> token_refused_{false};      // the last connect's answer refused the token, until one succeeds
  std::atomic<bool> unhealable_logged_{false};  // a refusal with unhealable_fix logged, until a connect succeeds
  mutable std::mutex error_mu_;                 // not mu_: note_down runs under it too
  std::string gateway_error_;                   // error_mu_: stats gateway_error
  // Connections sessions made again after losing theirs (stats: gateway_reconnects).
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<bool> ring_hinted_{false};
  OpCounters counters_;
  std::atomic<uint64_t> process_loads_{0};              // objects the gateway wrote into this process's memory (r5)
  std::atomic<uint64_t> process_stores_{0};             // objects the gateway stored from this process's memory (r5)
  std::atomic<uint64_t> process_stores_over_limit_{0};  // objects of stores sent through the ring instead (r6)
  std::atomic<bool> process_refusal_logged_{false};
  std::atomic<bool> process_withdrawn_logged_{false};  // a grant withdrawn after EPERM, logged once
  struct MappedRange {
    uintptr_t hi;
    uint64_t file_offset;
    std::shared_ptr<SegmentFile> file;  // null: not a shared memory file
  };
  std::mutex seg_mu_;
  std::map<uintptr_t, MappedRange> ranges_;               // by start address
  std::chrono::steady_clock::time_point maps_read_at_{};  // find_segment_by_scan's last read
  // The cached mapping holding lo (seg_mu_ held; ranges_.end(): none), and the span of [lo, lo + len) in its file.
  std::map<uintptr_t, MappedRange>::iterator cached_range(uintptr_t lo);
  SegmentSpan span_in(std::map<uintptr_t, MappedRange>::iterator it, uintptr_t lo, size_t len) const;
  // The file open for the mapping of (dev, ino) in ranges_, if any (seg_mu_ held).
  std::shared_ptr<SegmentFile> open_file(dev_t dev, ino_t ino) const;
  // Tests only (ADP_TEST_NO_PROCMAP_QUERY): every session answers as a kernel
  // without PROCMAP_QUERY (find_segment_by_scan, the nonce's proof, stores
  // through the ring).
  bool test_no_procmap_query_ = false;
  // Tests only (ADP_TEST_PUT_COPY_DELAY_MS): a pause between a put round's
  // start and the copy of its bytes, so a test can make the deadline pass
  // exactly there.
  std::chrono::milliseconds test_put_delay_{0};
};

}  // namespace adp
