// SPDX-License-Identifier: Apache-2.0
// GatewayClient: one connection to a gateway, as the client side of the
// protocol: connect, handshake (with a ring on Unix sockets, a token on
// TCP), then one batch at a time. Used by one thread; any error leaves the
// connection unusable (the caller drops it and connects anew, which also
// gives it a fresh ring: the gateway may still be reading the old one).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "protocol/messages.h"
#include "protocol/shared_ring.h"
#include "protocol/socket_io.h"

namespace adp {

// What a gateway's Error frame reads as on this side (GatewayClient::receive): this, then the frame's reason (up to
// proto::kMaxMessageBytes).
constexpr std::string_view kGatewayRefused = "gateway refused: ";
constexpr size_t kMaxRefusalBytes = kGatewayRefused.size() + proto::kMaxMessageBytes;

// A connection nothing was heard on for this long is looked at (one poll)
// before its next request: the gateway may have closed it meanwhile (a
// restart, --idle-timeout-s). Shorter than any restart or idle timeout; a
// connection in steady use pays nothing (GatewayClient::closed_while_idle).
inline constexpr std::chrono::milliseconds kIdleCheck{100};

// adapter_params reply_spin_us's default (lmcache_adp/config.py states the same).
inline constexpr std::chrono::microseconds kDefaultReplySpin{200};
// adapter_params connect_timeout_ms's default (lmcache_adp/config.py states the same): a connect's bound, its
// handshake included.
inline constexpr std::chrono::milliseconds kDefaultConnectTimeout{2000};

struct GatewayClientOptions {
  proto::Endpoint endpoint;
  std::string token;           // TCP
  uint64_t ring_bytes = 0;     // Unix: this connection's ring's payload area (mapped with one page more, r12)
  std::string client_name;     // shown in the gateway's log
  bool segments = true;        // Unix: ask for loads straight into registered shared memory (r3)
  bool ring_progress = true;   // Unix: ask for gets published piece by piece in the ring (r4)
  bool process_memory = true;  // Unix: ask for loads into this process's memory (r5)
  // Yama ptrace_scope 1: name a new gateway with PR_SET_PTRACER once the one
  // named has exited (trusts whoever of the uid binds the socket path).
  bool ptracer_follow = false;
  // gateway_stall_s: a request waiting this long with nothing heard from the
  // gateway makes it stalled (RemoteBackend::stalled_locked).
  std::chrono::nanoseconds stall_after{std::chrono::seconds(5)};
  // Tests: stands in for /proc/sys/kernel/yama/ptrace_scope if not negative
  // (ADP_TEST_YAMA_PTRACE_SCOPE, set by RemoteBackend from its test hooks).
  int test_yama_ptrace_scope = -1;
  // Tests: the gateway's pidfd is not taken from SO_PEERPIDFD, as on a kernel before Linux 6.5
  // (ADP_TEST_NO_PEER_PIDFD=1, set by RemoteBackend from its test hooks).
  bool test_no_peer_pidfd = false;
  // Tests: stands in for kIdleCheck (ADP_TEST_IDLE_CHECK_MS, set by RemoteBackend from its test hooks).
  std::chrono::nanoseconds idle_check{kIdleCheck};
  // A status query (protocol r10, Hello bit 9 alone): no ring, not a client
  // of the gateway (DEBUG lines only on an r10 gateway or later; no
  // --max-clients slot on an r11 one); only its handshake is used
  // (RemoteBackend::probe).
  bool status_query = false;
  // reply_spin_us: how long a worker polls for a put's or get's reply
  // without sleeping, from shortly before the reply is expected
  // (RemoteSession::spin_for_reply), while CPUs are idle; 0: never.
  std::chrono::microseconds reply_spin{kDefaultReplySpin};
  // connect_timeout_ms: a connect's bound, its handshake included, for every connect RemoteBackend makes (the
  // start-up connect, a batch's (its deadline, if sooner), the background reconnect's, the idle status query's:
  // RemoteBackend::connect_timeout_); also the outage bound of connects cut short in a row by their batches.
  // Not read by GatewayClient::Connect, which takes the deadline it is given.
  std::chrono::milliseconds connect_timeout{kDefaultConnectTimeout};
};

class GatewayClient {
 public:
  // With `watch`, its socket is watched through the connect and the handshake
  // (another thread may end both at once: proto::ConnectWatch), and unwatched
  // before this returns.
  static Status Connect(const GatewayClientOptions& opts, proto::Deadline deadline, std::unique_ptr<GatewayClient>* out,
                        proto::ConnectWatch* watch = nullptr);
  ~GatewayClient();
  GatewayClient(const GatewayClient&) = delete;
  GatewayClient& operator=(const GatewayClient&) = delete;

  // Sends req (plus inline payload iovecs) and waits for its reply, whose
  // item count is checked against the request. reply->payload points into
  // this client's receive buffer until the next call.
  Status call(const proto::BatchRequest& req, std::span<const iovec> payload, proto::Deadline deadline,
              proto::BatchReply* reply);
  // call() in two halves, for a client that works while the gateway does (r4).
  Status send(const proto::BatchRequest& req, std::span<const iovec> payload, proto::Deadline deadline);
  // Whether a frame went out on this connection since its handshake before
  // the last one (a request, a segment's or this process's registration): it
  // was in use, so the gateway may have closed it while it was idle since.
  // So is a connection made before the batch that now uses it and held idle meanwhile (a session's start-up
  // connect, the background reconnect's spare: held_idle()), its first request included (session 24: a restart
  // within kIdleCheck of its handshake met that request with EPIPE, and the batch failed, the gateway up).
  bool used_before() const { return held_idle_ || request_id_ > handshake_id_ + 1; }
  void held_idle() { held_idle_ = true; }
  // Whether the last frame (any of those) met the connection closed (EPIPE,
  // ECONNRESET) on a connection used_before(): the gateway closed it while it
  // was idle (a restart, --idle-timeout-s) and never had that frame whole; it
  // serves only whole frames, so the frame was not served and may go again at
  // once on a new connection (RemoteSession::lose).
  bool unsent_on_idle() const { return unsent_ && used_before(); }
  // Whether the last frame met the connection closed before anything of its
  // answer was read, on a connection used_before(): its send (unsent_on_idle())
  // or its answer's first read (the end of the stream, ECONNRESET). A TCP send
  // into a connection the gateway closed while it was idle succeeds once, and
  // the read then finds it closed; so does a gateway that died with the frame
  // and sent nothing back: it may have been served, so only a frame that may
  // go twice goes again quietly (RemoteSession::lose).
  bool closed_unanswered_on_idle() const { return closed_unanswered_ && used_before(); }
  // Whether the gateway closed this connection while nothing was asked of it
  // (hung up; looked at, one poll, only once nothing was heard on it for
  // kIdleCheck): replaced before use, its request never lost. Between batches.
  bool closed_while_idle();
  // r8: with `alive`, a kAlive frame for this request (heard from, still
  // waiting) returns Ok with *alive true and no reply, so the caller can look
  // at the stall before it waits again; without, it is read past.
  Status await_reply(const proto::BatchRequest& req, proto::Deadline deadline, proto::BatchReply* reply,
                     bool* alive = nullptr);
  // Whether the socket has something to read (a reply, an Error, the end):
  // await_reply() then does not wait on the gateway.
  bool readable() const;
  // Waits until the socket is readable (true) or `until` (false).
  bool wait_readable(proto::Deadline until) const;
  // wait_readable() to the microsecond (ppoll: the caller's timer slack applies); `until` already passed: one
  // look without sleeping.
  bool sleep_readable(proto::Deadline until) const;
  // Polls the socket without sleeping until it is readable, hung up or in
  // error (its revents: the read tells which) or `until` (0).
  short spin_readable(proto::Deadline until) const;

  // Registers a shared memory file (fd not taken over) under a new id on this
  // connection; 0 when this connection has no ids left.
  Status register_segment(int fd, uint64_t bytes, proto::Deadline deadline, uint32_t* id);
  // Whether the gateway took the segments feature (r3), and stores from
  // segments (granted on a memory-speed card only).
  // Not where the gateway's process cannot be watched (peer_gone()): its
  // death while it writes into a segment could not be told (review33b F4).
  bool segments() const { return segments_ && peer_watched_; }
  // Whether the gateway took bit 9 (r10; asked with GatewayClientOptions::status_query): an older gateway takes
  // the connection as a client's.
  bool status_query() const { return status_query_; }
  bool segment_stores() const { return segment_stores_ && peer_watched_; }
  // Whether the gateway publishes a get's pieces in the control page (r4).
  bool ring_progress() const { return ring_progress_; }
  // Whether the gateway writes loads into this process's memory (r5:
  // offered in HelloOk and granted by the registration that followed).
  bool process_loads() const { return process_granted_ & proto::kFeatureProcessLoads; }
  // Whether the gateway reads stores from this process's memory (r5, the same way).
  bool process_stores() const { return process_granted_ & proto::kFeatureProcessStores; }
  // r6: the largest object a process store may carry (the gateway's store
  // buffer); larger ones go through the ring. UINT64_MAX: the gateway (r5)
  // did not say.
  uint64_t process_store_limit() const { return process_store_limit_; }
  uint32_t process_features() const { return process_granted_; }
  // Why process memory is not in use though this client asked for it
  // (empty: granted, not asked, or a gateway of r4 or older).
  const std::string& process_refusal() const { return process_refusal_; }
  // The gateway lost access to this process (EPERM on a process item): this
  // connection uses the ring from now on.
  void withdraw_process(const std::string& why);
  // ptracer_follow: a connection refused because this process names another
  // gateway that still ran registers once that one has exited (called
  // between batches; a failed registration leaves the connection unusable).
  Status retry_process(proto::Deadline deadline);
  // Whether the ring starts with its control page (r3 segments, r4, r5).
  bool control_page() const { return proto::has_control_page(segments_, ring_progress_, process_offered_); }
  // The request id the next call() will carry (the load lease names it).
  uint64_t next_request_id() const { return request_id_ + 1; }
  // The load lease word in the ring's control page (segments() only).
  uint64_t* lease() const { return reinterpret_cast<uint64_t*>(ring_->data()); }
  // The gateway's pid (SO_PEERCRED), 0 if unknown (another PID namespace).
  int peer_pid() const { return peer_pid_; }
  // Whether the gateway process has exited (a zombie included): a lease it
  // holds WRITING is waited out only while it lives. Told by a pidfd of it
  // (SO_PEERPIDFD, Linux 6.5: whatever its PID namespace; else pidfd_open
  // of its pid), else by its pid; a connection with neither takes no
  // segments nor process memory (segments(), register_process). No wait,
  // never throws (RemoteSession::revoke_lease, in a destructor).
  bool peer_gone() const noexcept;

  proto::SharedRing* ring() const { return ring_.get(); }
  const proto::HelloOk& limits() const { return limits_; }
  const std::string& server() const { return server_; }
  // Ends any wait on this connection at once (another thread may call it).
  void interrupt() const;
  // Whether the gateway closed this connection (hung up: one poll, no wait);
  // any thread, while the connection is alive (RemoteBackend: in live_).
  bool peer_closed() const;

  // Liveness, read by other threads (RemoteBackend::stats; steady clock ns,
  // 0: none): when the request now waiting for its reply was sent, and when
  // the gateway was last heard from on this connection (a frame, or a get's
  // piece published in the ring: heard_now()).
  int64_t waiting_since_ns() const { return waiting_since_ns_.load(std::memory_order_relaxed); }
  int64_t heard_ns() const { return heard_ns_.load(std::memory_order_relaxed); }
  void heard_now();
  // r7: reads the control page's alive word (frame.h, kAliveAt); a change
  // since the last look is heard_now() (a gateway working on a long request
  // sends nothing until its reply). Any thread; no-op without a control page.
  void poll_alive() const;

 private:
  explicit GatewayClient(int fd) : fd_(fd) {}
  Status handshake(const GatewayClientOptions& opts, proto::Deadline deadline);
  // The next frame, of `type`; with `alive`, a kAlive frame (r8) for the
  // current request sets *alive instead (heard from, still waiting).
  Status receive(uint8_t type, proto::Deadline deadline, bool* alive = nullptr);
  void begin_wait();  // a request goes out: waiting from now until a frame comes
  // Every frame this client sends: table_ (and payload; pass_fd rides on it
  // if not -1) under the next request id, waiting from now (begin_wait);
  // notes whether it met the connection closed (unsent_on_idle()).
  Status write(proto::FrameType type, std::span<const iovec> payload, proto::Deadline deadline, int pass_fd = -1);
  // r5: after HelloOk offered process memory: Yama's ptracer, then
  // RegisterProcess with a probe of this process's memory.
  Status register_process(proto::Deadline deadline);
  // After HelloOk offered segments or process memory: the gateway's pid and
  // pidfd (peer_gone()); with neither, no segments nor process memory.
  void watch_peer();

  const int fd_;
  std::unique_ptr<proto::SharedRing> ring_;
  proto::HelloOk limits_;
  std::string server_;
  uint64_t request_id_ = 0;
  uint64_t handshake_id_ = 0;  // request_id_ once the handshake was done (used_before())
  bool held_idle_ = false;     // held_idle(): made before the batch that uses it (used_before())
  bool segments_ = false;
  bool segment_stores_ = false;
  bool ring_progress_ = false;
  bool alive_frames_ = false;   // r8: granted (no ring): kAlive frames come while a batch is worked on
  bool status_query_ = false;   // r10: granted (asked with GatewayClientOptions::status_query)
  bool error_classes_ = false;  // r9: granted: each I/O error of a reply says its class (Status::io_class)
  uint32_t process_offered_ = 0;
  uint32_t process_granted_ = 0;
  uint64_t process_store_limit_ = UINT64_MAX;
  std::string process_refusal_;
  bool ptracer_follow_ = false;
  int test_yama_ptrace_scope_ = -1;  // GatewayClientOptions::test_yama_ptrace_scope
  bool process_retry_ = false;       // refused while another named gateway ran: retry_process() tries again
  uint8_t probe_[16] = {};           // the probe the gateway reads back (RegisterProcess)
  uint32_t segments_registered_ = 0;
  int peer_pid_ = 0;
  int peer_pidfd_ = -1;              // a pidfd of the gateway (readable once it exited), -1: none
  bool peer_watched_ = true;         // false: neither a pidfd nor a pid of it (peer_gone() cannot tell)
  bool test_no_peer_pidfd_ = false;  // GatewayClientOptions::test_no_peer_pidfd
  std::vector<uint8_t> table_;
  proto::Frame frame_;
  mutable std::atomic<int64_t> waiting_since_ns_{0}, heard_ns_{0};
  mutable std::atomic<uint32_t> alive_seen_{0};  // the alive word at the last poll_alive()
  bool unsent_ = false;                          // the last frame met the connection closed (unsent_on_idle())
  bool answered_ = false;                        // a frame came since the last one sent
  bool closed_unanswered_ = false;               // closed_unanswered_on_idle()
  // closed_while_idle(): when the last frame came (not heard_ns(): another
  // thread's poll_alive() may see an old bump of the alive word only later)
  // and when it last polled (steady ns).
  int64_t frame_ns_ = 0, idle_checked_ns_ = 0;
  int64_t idle_check_ns_ = 0;  // GatewayClientOptions::idle_check
};

}  // namespace adp
