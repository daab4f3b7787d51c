// SPDX-License-Identifier: Apache-2.0
#include "transport/gateway_client.h"

#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <random>

#include "util/idle_cpus.h"
#include "util/log.h"

namespace adp {

Status GatewayClient::Connect(const GatewayClientOptions& opts, proto::Deadline deadline,
                              std::unique_ptr<GatewayClient>* out, proto::ConnectWatch* watch) {
  // The ring first: the gateway's handshake clock starts at connect.
  std::unique_ptr<proto::SharedRing> ring;
  if (opts.endpoint.kind == proto::Endpoint::Kind::kUnix && opts.ring_bytes && !opts.status_query) {
    // r12: the payload area ring_bytes, the control page beside it.
    Status s = proto::SharedRing::Create(proto::ring_map_bytes(opts.ring_bytes), &ring);
    if (!s.ok()) return s;
  }
  int fd = -1;
  Status s = proto::connect_endpoint(opts.endpoint, deadline, &fd, watch);
  if (!s.ok()) return s;
  std::unique_ptr<GatewayClient> c(new GatewayClient(fd));
  c->ring_ = std::move(ring);
  c->idle_check_ns_ = opts.idle_check.count();
  s = c->handshake(opts, deadline);
  if (watch) {
    watch->unwatch(fd);  // before c (a failed handshake) closes it
    if (!s.ok() && watch->cancelled()) s = Status::Closed("connect to " + opts.endpoint.str() + " abandoned");
  }
  if (!s.ok()) return s;
  c->handshake_id_ = c->request_id_;
  *out = std::move(c);
  return Status::Ok();
}

GatewayClient::~GatewayClient() {
  ::close(fd_);
  if (peer_pidfd_ >= 0) ::close(peer_pidfd_);
}

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(proto::Clock::now().time_since_epoch()).count();
}
}  // namespace

void GatewayClient::begin_wait() { waiting_since_ns_.store(steady_ns(), std::memory_order_relaxed); }

Status GatewayClient::write(proto::FrameType type, std::span<const iovec> payload, proto::Deadline deadline,
                            int pass_fd) {
  begin_wait();
  // Bytes the gateway takes are a sign of life (heard_ns_): a put of a large object over a slow TCP link (12 s for
  // 24 MiB at 2 MiB/s) read as a stalled gateway after gateway_stall_s (session 31). Only bytes taken after the
  // socket was full count (write_frame's moved_ns): a request that goes whole into the socket buffer is no sign of
  // life, and counted as one it hid a stopped gateway from every connection's wait (heard_locked() is the latest
  // over them all; session 32, review32 P1).
  Status s = proto::write_frame(fd_, type, ++request_id_, table_, payload, deadline, pass_fd, &heard_ns_);
  unsent_ = closed_unanswered_ = s.code() == Status::Code::kClosed;
  answered_ = false;
  return s;
}

void GatewayClient::heard_now() { heard_ns_.store(steady_ns(), std::memory_order_relaxed); }

void GatewayClient::poll_alive() const {
  if (!ring_ || !control_page()) return;
  const uint32_t word =
      __atomic_load_n(reinterpret_cast<const uint32_t*>(ring_->data() + proto::kAliveAt), __ATOMIC_RELAXED);
  if (alive_seen_.exchange(word, std::memory_order_relaxed) != word)
    heard_ns_.store(steady_ns(), std::memory_order_relaxed);
}

void GatewayClient::interrupt() const { ::shutdown(fd_, SHUT_RDWR); }

bool GatewayClient::peer_closed() const {
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

Status GatewayClient::handshake(const GatewayClientOptions& opts, proto::Deadline deadline) {
  proto::Hello hello;
  if (opts.status_query) {
    hello.features = proto::kFeatureStatusQuery;  // r10; alone (r11: with any of bits 0-8 it is refused)
  } else if (ring_) {
    hello.features = proto::kFeatureRing |
                     (opts.segments ? proto::kFeatureSegments | proto::kFeatureSegmentStores : 0) |
                     (opts.ring_progress ? proto::kFeatureRingProgress : 0) |
                     (opts.process_memory ? proto::kFeatureProcessMemory | proto::kFeatureStoreLimit : 0);
    hello.ring_bytes = ring_->size();
  } else {
    hello.features = proto::kFeatureAlive;  // r8: no ring, so no alive word: frames instead
  }
  if (!opts.status_query) hello.features |= proto::kFeatureErrorClass;  // r9: each I/O error's class, either transport
  hello.token = opts.token;
  hello.client_name = opts.client_name;
  table_.clear();
  proto::encode_hello(hello, &table_);
  Status s = write(proto::FrameType::kHello, {}, deadline, ring_ ? ring_->fd() : -1);
  if (s.ok()) {
    s = receive(static_cast<uint8_t>(proto::FrameType::kHelloOk), deadline);
  } else if (s.code() == Status::Code::kClosed) {
    // A gateway over a limit writes its reason and closes before reading
    // the Hello: the reason beats "broken pipe".
    Status why = receive(static_cast<uint8_t>(proto::FrameType::kHelloOk), deadline);
    if (why.code() == Status::Code::kUnavailable) return why;
  }
  if (s.ok()) s = proto::decode_hello_ok(frame_.body, &limits_);
  if (s.ok() && bool(limits_.features & proto::kFeatureRing) != bool(ring_))
    s = Status::InvalidArgument("the gateway did not take the ring");
  if (!s.ok()) return s;
  segments_ = ring_ && (limits_.features & proto::kFeatureSegments);
  segment_stores_ = segments_ && (limits_.features & proto::kFeatureSegmentStores);
  ring_progress_ = ring_ && opts.ring_progress && (limits_.features & proto::kFeatureRingProgress);
  alive_frames_ = !ring_ && (limits_.features & proto::kFeatureAlive);
  error_classes_ = limits_.features & proto::kFeatureErrorClass;
  status_query_ = opts.status_query && (limits_.features & proto::kFeatureStatusQuery);
  process_offered_ = ring_ && opts.process_memory ? limits_.features & proto::kFeatureProcessMemory : 0;
  test_no_peer_pidfd_ = opts.test_no_peer_pidfd;
  if (segments_ || process_offered_) watch_peer();
  ptracer_follow_ = opts.ptracer_follow;
  test_yama_ptrace_scope_ = opts.test_yama_ptrace_scope;
  server_ = std::string(limits_.server);
  limits_.server = server_;  // the frame buffer is reused
  // Not registered where the gateway cannot be watched (watch_peer: process_refusal_ says why); the control page
  // stays, as the gateway laid the ring out.
  return process_offered_ && peer_watched_ ? register_process(deadline) : Status::Ok();
}

namespace {
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5
#endif

// The gateway this process names with PR_SET_PTRACER (Yama ptrace_scope 1).
// The kernel keeps one ptracer per process and drops it when that gateway
// exits. By default a process names one gateway for its life (a pidfd of it
// kept, so a refusal can say it has exited): whoever answers on the socket
// path later gets the ring. With ptracer_follow a connection names its own
// gateway when the named one has exited (a restart: a new pid, or even the
// old pid again); that trusts every process of the uid that can bind the
// socket path. While the named gateway runs, a connection to another gateway
// keeps the ring either way: naming its gateway would take the grant from
// the first one's connections in the middle of their transfers.
struct PtracerRecord {
  pid_t owner = 0;  // the process that named it (a forked child names none yet)
  pid_t pid = 0;    // the gateway named, 0: none
  int pidfd = -1;   // a pidfd of it, readable once it exits (-1: none, kill(pid, 0) asked instead)
};
std::mutex g_ptracer_mu;
PtracerRecord g_ptracer;

// fork(): the prepare handler takes the record's mutex, so no other thread
// holds it across the fork; the child forgets its parent's record (its
// gateway is named afresh) and closes the pidfd while its number is still
// certainly the inherited one, then both sides let the mutex go.
void ptracer_before_fork() { g_ptracer_mu.lock(); }
void ptracer_after_fork_parent() { g_ptracer_mu.unlock(); }
void ptracer_after_fork_child() {
  if (g_ptracer.pidfd >= 0) ::close(g_ptracer.pidfd);
  g_ptracer = PtracerRecord{};
  g_ptracer_mu.unlock();
}
// The line's lock's handlers registered first (log_fork_handlers): a registration logs a WARNING under the record's
// lock, so a fork takes the record's before the line's (review40b: the other way round, a fork and a registration
// waited for each other for ever).
[[maybe_unused]] const int g_ptracer_atfork =
    (log_fork_handlers(), ::pthread_atfork(ptracer_before_fork, ptracer_after_fork_parent, ptracer_after_fork_child));

// Whether the gateway the record names has exited.
bool named_gateway_exited(const PtracerRecord& r) {
  if (r.pidfd >= 0) {
    pollfd p{r.pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  return ::kill(r.pid, 0) != 0 && errno == ESRCH;  // a kernel without pidfds: the pid may be reused
}

// A pidfd of the process at the other end of `sock` (SO_PEERPIDFD, else
// pidfd_open of its pid, if known), or -1. no_peer_pidfd (tests): as on a
// kernel without SO_PEERPIDFD.
int peer_pidfd(int sock, pid_t pid, bool no_peer_pidfd) {
  int fd = -1;
  socklen_t len = sizeof fd;
  if (!no_peer_pidfd && ::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) return fd;
  return pid > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)) : -1;
}

// Whether the process `pid` is gone or a zombie (a kernel without pidfds; the pid may be reused meanwhile).
// Never throws: no memory to read its state, not known gone.
bool pid_gone(int pid) noexcept {
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

std::atomic<bool> g_unwatched_logged{false};

// Yama's ptrace_scope (0 without Yama). A test's stand-in for the file
// (ADP_TEST_YAMA_PTRACE_SCOPE, on a kernel without Yama) if not negative.
int yama_ptrace_scope(int test_scope) {
  if (test_scope >= 0) return test_scope;
  int scope = 0;
  std::ifstream("/proc/sys/kernel/yama/ptrace_scope") >> scope;
  return scope;
}
}  // namespace

void GatewayClient::watch_peer() {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) peer_pid_ = cred.pid;
  // The gateway's pid is 0 where it lives in a PID namespace this process cannot see (separate containers sharing
  // /dev/shm and the socket: the Dockerfile's deployment); a pidfd names it whatever the namespace, and is not
  // fooled by a reused pid. Taken once per connection, polled only while a revoke waits out a WRITING lease.
  peer_pidfd_ = peer_pidfd(fd_, peer_pid_, test_no_peer_pidfd_);
  if (peer_pidfd_ >= 0 || peer_pid_ > 0) return;
  // Neither: a gateway killed while it writes an object into LMCache's memory would leave its lease WRITING for
  // good, and the revoke could not tell it from one stopped mid-copy (which must be waited out: a byte may still
  // land). Nor does the socket's hang-up tell it: a stopping gateway shuts its connections down while a handler
  // may still be copying. So this connection loads and stores through the ring (whose bytes the connector copies
  // itself): slower, never hung.
  peer_watched_ = false;
  if (process_offered_)
    process_refusal_ =
        "the gateway's process cannot be watched from here (its pid is not visible and the kernel has no "
        "SO_PEERPIDFD)";
  if (!g_unwatched_logged.exchange(true))
    ADP_WARN(
        "the gateway's process cannot be watched from here: its pid is not visible (another PID namespace) and this "
        "kernel has no SO_PEERPIDFD (Linux 6.5), so a gateway that died while writing into LMCache's memory could "
        "not be told from a stopped one; loads and stores go through the ring, not in place (share the PID "
        "namespace, e.g. docker --pid host, or use Linux 6.5 or later). Logged once.");
}

bool GatewayClient::peer_gone() const noexcept {
  if (peer_pidfd_ >= 0) {
    pollfd p{peer_pidfd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
  }
  return peer_pid_ > 0 && pid_gone(peer_pid_);
}

void GatewayClient::withdraw_process(const std::string& why) {
  process_granted_ = 0;
  process_refusal_ = why;
}

Status GatewayClient::register_process(proto::Deadline deadline) {
  // Yama (kernel.yama.ptrace_scope): 0 lets a process of the same uid read
  // and write this one; 1 only the process this one names (one per process,
  // see g_ptracer); 2 and 3 no one: the ring.
  const int scope = yama_ptrace_scope(test_yama_ptrace_scope_);
  if (scope >= 2) {
    process_refusal_ = "Yama ptrace_scope is " + std::to_string(scope) + " (only 0 or 1 let the gateway in)";
    return Status::Ok();
  }
  if (scope == 1) {
    // The gateway's pid as this process sees it: 0 when it lives in another PID namespace.
    if (peer_pid_ <= 0) {
      process_refusal_ = "Yama ptrace_scope is 1 and the gateway's pid is not visible here (another PID namespace)";
      return Status::Ok();
    }
    std::lock_guard<std::mutex> l(g_ptracer_mu);
    PtracerRecord& r = g_ptracer;
    if (r.owner != ::getpid()) {
      // A child forked without the atfork handler (a raw clone): the number
      // may be one of its own descriptors by now, so it is forgotten, not closed.
      r = PtracerRecord{};
    }
    const bool exited = r.pid != 0 && named_gateway_exited(r);
    if (peer_pid_ == ::getpid()) {
      // A gateway in this very process (as in tests): it needs no ptracer, and naming it would keep every
      // other gateway out for the life of the process.
    } else if (r.pid != 0 && !exited && r.pid != peer_pid_) {
      process_refusal_ = "Yama ptrace_scope is 1 and this process names gateway pid " + std::to_string(r.pid) +
                         " with PR_SET_PTRACER, which still runs (the kernel keeps one ptracer per process)";
      // With ptracer_follow this connection registers on a later batch once that gateway has exited.
      process_retry_ = ptracer_follow_;
      return Status::Ok();
    } else if (exited && !ptracer_follow_) {
      process_refusal_ = "Yama ptrace_scope is 1 and named gateway pid " + std::to_string(r.pid) +
                         " has exited: reconnecting to a new gateway needs ptracer_follow=true or a new process";
      return Status::Ok();
    } else if (r.pid == 0 || exited) {
      const int pidfd = peer_pidfd(fd_, peer_pid_, test_no_peer_pidfd_);
      if (::prctl(PR_SET_PTRACER, static_cast<unsigned long>(peer_pid_), 0, 0, 0) != 0) {
        process_refusal_ = "prctl(PR_SET_PTRACER) failed: " + errno_text(errno);
        if (pidfd >= 0) ::close(pidfd);
        return Status::Ok();
      }
      if (exited)
        ADP_WARN(
            "Yama ptrace_scope 1: this process names gateway pid %d with PR_SET_PTRACER (gateway pid %d, "
            "named before, has exited; ptracer_follow=true trusts whoever listens on the socket path)",
            static_cast<int>(peer_pid_), static_cast<int>(r.pid));
      if (r.pidfd >= 0) ::close(r.pidfd);
      r.owner = ::getpid();
      r.pid = peer_pid_;
      r.pidfd = pidfd;
    }
  }
  std::random_device rd;
  for (size_t i = 0; i < sizeof probe_; i += 4) {
    uint32_t v = rd();
    std::memcpy(probe_ + i, &v, 4);
  }
  proto::RegisterProcess reg;
  reg.pid = static_cast<uint32_t>(::getpid());
  reg.probe_addr = reinterpret_cast<uintptr_t>(probe_);
  reg.probe = std::span<const uint8_t>(probe_, sizeof probe_);
  table_.clear();
  proto::encode_register_process(reg, &table_);
  Status s = write(proto::FrameType::kRegisterProcess, {}, deadline);
  if (s.ok()) s = receive(static_cast<uint8_t>(proto::FrameType::kProcessOk), deadline);
  proto::ProcessOk ok;
  if (s.ok()) s = proto::decode_process_ok(frame_.body, &ok);
  if (s.ok() && (ok.features & ~process_offered_))
    s = Status::InvalidArgument("gateway granted process-memory features it did not offer");
  if (!s.ok()) return s;
  process_granted_ = ok.features;
  // r6: objects larger than the gateway's store buffer go through the ring
  // (an r5 gateway says nothing: no limit known, as before).
  if (ok.with_store_limit) process_store_limit_ = ok.max_store_object_bytes;
  if (!process_granted_) process_refusal_ = ok.reason.empty() ? "no reason given" : std::string(ok.reason);
  return Status::Ok();
}

Status GatewayClient::retry_process(proto::Deadline deadline) {
  if (!process_retry_) return Status::Ok();
  {
    std::lock_guard<std::mutex> l(g_ptracer_mu);
    if (g_ptracer.owner == ::getpid() && g_ptracer.pid != 0 && !named_gateway_exited(g_ptracer)) return Status::Ok();
  }
  process_retry_ = false;
  process_refusal_.clear();
  return register_process(deadline);
}

Status GatewayClient::receive(uint8_t type, proto::Deadline deadline, bool* alive) {
  // So are the bytes of a reply as they come (a load's over a slow link), not only its whole frame.
  Status s = proto::read_frame(fd_, proto::kMaxFrameBodyBytes, deadline, &frame_, 0, &heard_ns_);
  if (!s.ok()) {
    closed_unanswered_ = closed_unanswered_ || (!answered_ && s.code() == Status::Code::kClosed);
    return s;  // still waiting, as far as RemoteBackend::stats is concerned: the caller drops it
  }
  answered_ = true;
  frame_ns_ = steady_ns();  // heard now
  heard_ns_.store(frame_ns_, std::memory_order_relaxed);
  if (alive && alive_frames_ && frame_.header.type == static_cast<uint8_t>(proto::FrameType::kAlive) &&
      frame_.header.request_id == request_id_) {
    *alive = true;  // r8: working on it; still waiting
    return Status::Ok();
  }
  waiting_since_ns_.store(0, std::memory_order_relaxed);
  if (frame_.header.type == static_cast<uint8_t>(proto::FrameType::kError)) {
    std::string_view reason;
    s = proto::decode_error(frame_.body, &reason);
    return Status::Unavailable(std::string(kGatewayRefused) + std::string(s.ok() ? reason : "(unreadable reason)"));
  }
  if (frame_.header.type != type || frame_.header.request_id != request_id_)
    return Status::InvalidArgument("gateway sent an unexpected frame");
  return Status::Ok();
}

Status GatewayClient::register_segment(int fd, uint64_t bytes, proto::Deadline deadline, uint32_t* id) {
  *id = 0;
  if (!segments_ || segments_registered_ >= proto::kMaxSegments) return Status::Ok();
  proto::RegisterSegment reg{segments_registered_ + 1, bytes};
  table_.clear();
  proto::encode_register_segment(reg, &table_);
  Status s = write(proto::FrameType::kRegisterSegment, {}, deadline, fd);
  if (s.ok()) s = receive(static_cast<uint8_t>(proto::FrameType::kSegmentOk), deadline);
  if (s.ok() && !frame_.body.empty()) s = Status::InvalidArgument("gateway sent an unexpected frame");
  if (!s.ok()) return s;
  *id = ++segments_registered_;
  return Status::Ok();
}

Status GatewayClient::call(const proto::BatchRequest& req, std::span<const iovec> payload, proto::Deadline deadline,
                           proto::BatchReply* reply) {
  Status s = send(req, payload, deadline);
  return s.ok() ? await_reply(req, deadline, reply) : s;
}

Status GatewayClient::send(const proto::BatchRequest& req, std::span<const iovec> payload, proto::Deadline deadline) {
  table_.clear();
  proto::encode_batch(req, &table_);
  return write(proto::FrameType::kBatch, payload, deadline);
}

bool GatewayClient::closed_while_idle() {
  const int64_t now = steady_ns();
  if (now - std::max(frame_ns_, idle_checked_ns_) < idle_check_ns_) return false;
  idle_checked_ns_ = now;
  // POLLRDHUP: the gateway's end is closed (a TCP send would still succeed
  // once; the reply's read would then find it closed, after the request went).
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

bool GatewayClient::readable() const {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

bool GatewayClient::wait_readable(proto::Deadline until) const {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - proto::Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 0, 60000)));
    if (r > 0 || (r < 0 && errno != EINTR)) return true;  // readable, hung up or an error: the read tells
    if (proto::Clock::now() >= until) return false;
  }
}

bool GatewayClient::sleep_readable(proto::Deadline until) const {
  for (;;) {
    // `until` passed already: one look, no sleep (a reply there is not the spin's to catch).
    const auto ns =
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(until - proto::Clock::now()).count());
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    pollfd p{fd_, POLLIN, 0};
    const int r = ::ppoll(&p, 1, &ts, nullptr);
    if (r > 0 || (r < 0 && errno != EINTR)) return true;  // readable, hung up or an error: the read tells
    if (r == 0) return false;                             // until passed
  }
}

short GatewayClient::spin_readable(proto::Deadline until) const { return spin_poll(fd_, until); }

Status GatewayClient::await_reply(const proto::BatchRequest& req, proto::Deadline deadline, proto::BatchReply* reply,
                                  bool* alive) {
  bool heard_alive = false;
  Status s;
  do {
    heard_alive = false;
    s = receive(static_cast<uint8_t>(proto::FrameType::kBatchReply), deadline, &heard_alive);
  } while (s.ok() && heard_alive && !alive);  // no caller to tell: read on to the reply
  if (s.ok() && heard_alive) {
    *alive = true;
    return s;
  }
  if (alive) *alive = false;
  if (s.ok()) s = proto::decode_batch_reply(frame_.body, reply, error_classes_);
  if (s.ok() && reply->results.size() != req.items.size())
    s = Status::InvalidArgument("gateway answered " + std::to_string(reply->results.size()) + " results for " +
                                std::to_string(req.items.size()) + " keys");
  return s;
}

}  // namespace adp
