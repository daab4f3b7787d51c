// SPDX-License-Identifier: Apache-2.0
#include "gateway/gateway_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <new>
#include <system_error>

#include "protocol/messages.h"
#include "util/amount.h"
#include "util/log.h"
#include "util/populate.h"
#include "util/test_hooks.h"
#include "util/thread_name.h"

namespace adp {

namespace {

// Raises this process's soft RLIMIT_NOFILE to its hard limit (review33b F3): under systemd and several container
// runtimes the soft limit is 1024, while the gateway's own limits allow far more descriptors (per local client its
// socket, its ring's memfd, its pidfds and up to 8 segment files). Warns when even the hard limit is below what
// those limits can take, as the accept thread then pauses (accept_paused) with clients waiting in the backlog.
void raise_open_file_limit(const GatewayOptions& opts) {
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) return;
  const rlim_t before = nofile.rlim_cur;
  if (nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) nofile.rlim_cur = before;
  }
  // Per local client: socket, ring, pidfd and a thread's pidfd, 8 segment files; per TCP peer its socket; and the
  // card, the I/O contexts, the listening sockets and the like.
  constexpr uint64_t kPerLocalClient = 12, kBase = 64;
  const uint64_t need = kPerLocalClient * (static_cast<uint64_t>(opts.max_clients) + kStatusQueryReserve) +
                        static_cast<uint64_t>(opts.max_tcp_clients) + opts.max_handshakes + kBase;
  if (nofile.rlim_cur != before)
    ADP_INFO("gateway: open-file limit (RLIMIT_NOFILE) raised from %llu to its hard limit %llu",
             static_cast<unsigned long long>(before), static_cast<unsigned long long>(nofile.rlim_cur));
  if (nofile.rlim_cur != RLIM_INFINITY && nofile.rlim_cur < need)
    ADP_WARN(
        "gateway: open-file limit (RLIMIT_NOFILE) %llu (hard %llu) is below the %llu descriptors --max-clients %d, "
        "--max-tcp-clients %d and --max-handshakes %d can take (about %llu a local client): past it new "
        "connections wait in the backlog (raise the hard limit, e.g. LimitNOFILE= or docker --ulimit nofile=)",
        static_cast<unsigned long long>(nofile.rlim_cur), static_cast<unsigned long long>(nofile.rlim_max),
        static_cast<unsigned long long>(need), opts.max_clients, opts.max_tcp_clients, opts.max_handshakes,
        static_cast<unsigned long long>(kPerLocalClient));
}

}  // namespace

Status GatewayServer::Start(const GatewayOptions& opts, std::unique_ptr<GatewayServer>* out) {
  std::unique_ptr<GatewayServer> g(new GatewayServer());
  g->opts_ = opts;
  Status s = proto::parse_endpoint("unix://" + opts.socket_path, &g->unix_ep_);
  if (s.ok() && !opts.tcp_listen.empty()) {
    s = proto::parse_endpoint(opts.tcp_listen, &g->tcp_ep_);
    if (s.ok() && g->tcp_ep_.kind != proto::Endpoint::Kind::kTcp)
      s = Status::InvalidArgument("--listen takes tcp://HOST:PORT, got " + opts.tcp_listen);
    if (s.ok() && opts.token.empty()) s = Status::InvalidArgument("a TCP listener needs a token (--token-file)");
  }
  // 0 would clamp every batch's deadline to now: every item TimedOut
  // (review r9 N3; the CLI's range is 1..86400 s).
  if (s.ok() && opts.max_request_timeout_ms == 0)
    s = Status::InvalidArgument("max_request_timeout_ms must be at least 1 (--max-request-timeout-s >= 1)");
  // The ranges of kGatewayOptionRanges, checked here too, not only by the CLI (review34 F3, utf34): 0 I/O contexts
  // would answer the handshake and then time out every request waiting for a context, which looks like a hung
  // gateway; a negative count reached IoContextPool as a size_t (contexts made until memory ran out); a negative spin
  // was taken as 0 without a word and one of 10^9 us let a connection's thread spin up to 1000 s after a request for
  // the next; a pipelined-store count under -1 was taken as -1 (half the contexts) without a word. A program that
  // starts a GatewayServer itself gets what `lmcache-adp gateway` would.
  for (const GatewayOptionRange& r : kGatewayOptionRanges) {
    const int v = opts.*r.field;
    if (s.ok() && (v < r.min || v > r.max))
      s = Status::InvalidArgument(std::string(r.name) + " must be in [" + std::to_string(r.min) + ", " +
                                  std::to_string(r.max) + "] (" + r.flag + "), got " + std::to_string(v));
  }
  if (!s.ok()) return s;
  // The test hooks, read once here for every connection; each one set is
  // logged (review r9 N2). Before the card opens: its prefault asks whether
  // the kernel refuses MADV_POPULATE_* (util/populate.h).
  TestHooks hooks = read_test_hooks();
  if (hooks.segment_populate_einval) refuse_populate_for_test();  // segments, card stores, the prefault
  raise_open_file_limit(opts);
  // The card first: its lock tells a second gateway on the same card to go
  // away before it touches the socket of the first.
  s = CardStore::Open(opts.card, &g->store_);
  if (!s.ok()) return s;
  s = proto::listen_endpoint(&g->unix_ep_, 128, &g->unix_fd_, {hooks.socket_bind_gate, hooks.socket_refuse_chmod});
  if (struct stat sock; s.ok() && ::lstat(g->unix_ep_.path.c_str(), &sock) == 0) {
    g->socket_dev_ = sock.st_dev;
    g->socket_ino_ = sock.st_ino;
  }
  if (s.ok() && !opts.tcp_listen.empty()) s = proto::listen_endpoint(&g->tcp_ep_, 128, &g->tcp_fd_);
  if (s.ok()) {
    g->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g->wake_fd_ < 0) s = Status::IoError("eventfd: " + errno_text(errno));
  }
  if (!s.ok()) {
    g->shutdown_store();
    return s;
  }
  // From here on, what cannot be made (std::bad_alloc: the I/O contexts, the connections' shared state, the
  // helpers' pool; std::system_error or std::bad_alloc: the accept thread's start) fails the start with the reason,
  // the card closed and the socket removed (shutdown_store), where the exception went out of Start (session 25).
  const char* step = "the gateway cannot make its connections' shared state";
  try {
    g->pool_ = std::make_unique<IoContextPool>(opts.io_contexts);
    g->shared_.reset(
        new GatewayShared{g->store_.get(), g->pool_.get(), opts.token, "gateway on card " + opts.card.path});
    g->shared_->request_spin = std::chrono::microseconds(std::max(0, opts.request_spin_us));
    // By default half the I/O contexts, rounded down: with one context, none
    // (a pipelined store may hold its context for its bound while its client's
    // memory is slow; review r9 S4). Only an explicit value reaches the contexts.
    g->shared_->max_pipelined_stores = opts.max_pipelined_stores >= 0 ? static_cast<uint32_t>(opts.max_pipelined_stores)
                                                                      : static_cast<uint32_t>(opts.io_contexts) / 2;
    // An object's pieces on at most kMaxPieceHelpers helpers beside its own
    // thread: the 16-core probe loaded 4 connections at 1.0-1.3x embedded
    // with 2 or 3 threads each (benchmarks/README.md, "Session seven").
    constexpr int kMaxPieceHelpers = 2;
    const int cpus = PiecePool::usable_cpus(hooks.cpu_max_file);
    const int helpers = opts.process_write_threads < 0 ? cpus : opts.process_write_threads;
    // ADP_TEST_GATEWAY_CPUS=N makes the pool count N CPUs in its rule (helpers,
    // the store pipeline: PiecePool::spare_cpu()), not this machine's, so a
    // test decides whether its connections find a spare one.
    g->shared_->hooks = std::move(hooks);
    warn_test_hooks(g->shared_->hooks, HookSide::kGateway);
    apply_failing_hold(g->shared_->hooks);
    const int rule_cpus = g->shared_->hooks.gateway_cpus > 0 ? g->shared_->hooks.gateway_cpus : cpus;
    g->shared_->spin_load.cpus = rule_cpus;
    if (!g->shared_->hooks.loadavg_file.empty()) g->shared_->spin_load.path = g->shared_->hooks.loadavg_file;
    if (g->shared_->hooks.spin_load_every_ms >= 0)
      g->shared_->spin_load.every_ns = int64_t{g->shared_->hooks.spin_load_every_ms} * 1'000'000;
    if (helpers > 0) g->shared_->pieces = std::make_unique<PiecePool>(helpers, kMaxPieceHelpers, rule_cpus);
    g->shared_->max_segment_total_bytes = opts.max_segment_total_bytes;
    if (opts.segment_prefault) g->shared_->segment_prefault = std::make_unique<proto::SegmentPrefaulter>();
    g->shared_->limits = {opts.max_clients,
                          opts.max_tcp_clients,
                          opts.handshake_timeout_ms,
                          opts.idle_timeout_ms,
                          opts.max_ring_bytes,
                          opts.max_ring_total_bytes,
                          opts.max_store_buffer_bytes,
                          opts.max_store_buffer_total_bytes,
                          opts.max_request_timeout_ms};
    StoreStats st = g->store_->stats();
    // The CPUs its rules count (stats usable_cpus), so that an operator sees a container's quota taken.
    const std::string cpus_text = g->shared_->hooks.gateway_cpus > 0
                                      ? std::to_string(rule_cpus) + " CPUs counted (ADP_TEST_GATEWAY_CPUS)"
                                      : PiecePool::usable_cpus_text(g->shared_->hooks.cpu_max_file);
    ADP_INFO("gateway: card %s open (%llu objects, %s of %s used); listening on %s%s%s; %s", opts.card.path.c_str(),
             static_cast<unsigned long long>(st.objects), log_amount(st.used_bytes).c_str(),
             log_amount(st.capacity_bytes).c_str(), g->unix_ep_.str().c_str(), g->tcp_fd_ >= 0 ? " and " : "",
             g->tcp_fd_ >= 0 ? g->tcp_ep_.str().c_str() : "", cpus_text.c_str());
    step = "the gateway cannot start its accept thread";
    // Tests only (ADP_TEST_ACCEPT_THREAD_FAIL): that start fails as under a pids limit (system) or with no memory
    // for the thread's state (alloc).
    if (const std::string& fail = g->shared_->hooks.accept_thread_fail; fail == "alloc")
      throw std::bad_alloc();
    else if (fail == "system")
      throw std::system_error(EAGAIN, std::generic_category());
    g->accept_thread_ = std::thread(&GatewayServer::accept_loop, g.get());
  } catch (const std::exception& e) {
    const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    s = Status::IoError(std::string(step) + " (" + (memory ? "out of memory: std::bad_alloc" : e.what()) + ")");
    g->shutdown_store();
    return s;
  }
  *out = std::move(g);
  return Status::Ok();
}

GatewayServer::~GatewayServer() {
  stop();
  if (accept_thread_.joinable()) accept_thread_.join();
  shutdown_store();
  if (wake_fd_ >= 0) ::close(wake_fd_);  // last: client threads and stop() write to it
}

void GatewayServer::wake() {
  uint64_t one = 1;
  ssize_t w = ::write(wake_fd_, &one, sizeof one);
  (void)w;  // a full counter still wakes the loop
}

void GatewayServer::stop() {
  if (stopping_.exchange(true) || wake_fd_ < 0) return;
  wake();
}

bool GatewayServer::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return stopped_cv_.wait_for(l, timeout, [this] { return stopped_; });
}

StoreStats GatewayServer::stats() const {
  StoreStats st;
  {
    std::lock_guard<std::mutex> l(mu_);
    st = store_ ? store_->stats() : final_stats_;
  }
  if (shared_) {  // the connections' count: the card store does not count lookups
    st.lookup_hits = shared_->lookup_hits.load(std::memory_order_relaxed);
    st.lookup_misses = shared_->lookup_misses.load(std::memory_order_relaxed);
  }
  return st;
}

std::string GatewayServer::stats_json() const { return adp::stats_json(stats(), *shared_); }

GatewayServer::Open GatewayServer::open_connections(bool local_only, bool without_hung_up) const {
  using Phase = ConnectionControl::Phase;
  Open n;
  std::vector<pollfd> fds;  // without_hung_up: those that may be left out
  for (const Client& c : clients_) {
    if (c.done || (local_only && c.tcp)) continue;
    const Phase phase = c.control->phase.load(std::memory_order_seq_cst);
    if (without_hung_up && !c.tcp && (phase == Phase::kHandshake || phase == Phase::kReserveQuery))
      fds.push_back({c.fd, 0, 0});  // POLLHUP is reported unasked
    switch (phase) {
      case Phase::kHandshake:
        n.handshakes++;
        break;
      case Phase::kClient:
        n.clients++;
        break;
      case Phase::kStatusQuery:
        n.status_queries++;
        break;
      case Phase::kReserveQuery:
        n.reserve_queries++;
        break;
      case Phase::kEnded:
        break;
    }
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return n;
  for (size_t i = 0; i < fds.size(); i++)
    if (fds[i].revents & POLLHUP) n.hung_up++;
  return n;
}

size_t GatewayServer::clients() const {
  std::lock_guard<std::mutex> l(mu_);
  const Open open = open_connections(false);
  return open.clients + open.handshakes;
}

int GatewayServer::accept_one(int listen_fd, bool tcp) {
  int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    // Out of descriptors (EMFILE: this process's RLIMIT_NOFILE; ENFILE: the system's) or kernel memory (ENOBUFS,
    // ENOMEM): the connection stays in the backlog and the socket stays readable, so the caller stops polling it for
    // a while (accept_loop). Any other failure (EAGAIN, the peer left first) leaves nothing pending.
    const int err = errno;
    return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM ? err : 0;
  }
  std::lock_guard<std::mutex> l(mu_);
  // Where anything here cannot be made (std::system_error from the thread's start: a pids limit, memory;
  // std::bad_alloc from its entry, its control block, its thread's state, or the count of those connected) that
  // connection is refused and the gateway goes on, where the exception ended the whole gateway (std::terminate on
  // the accept thread), so that a client flooding connections under such a limit took everyone's down. The
  // refusals below throw nothing (refuse_at_accept): the descriptor is still this function's at any throw.
  bool counted_tcp = false, entered = false;
  try {
    if (tcp) {
      // Unauthenticated peers have a pool of their own: however many there
      // are, they take no slot (and no thread) of local or authenticated clients.
      // Refused with a reason (r14; closed with none until r13): a connector's
      // idle status query refused so reads the gateway up, as for local clients.
      if (shared_->tcp_handshakes.load() >= static_cast<uint32_t>(opts_.max_handshakes)) {
        shared_->refused++;
        ADP_WARN_LIMITED("gateway: refusing a TCP connection: %d handshakes in progress already (--max-handshakes)",
                         opts_.max_handshakes);
        proto::refuse_at_accept(fd, "%s (%d, --max-handshakes)", proto::kTooManyTcpHandshakes, opts_.max_handshakes);
        return 0;
      }
      shared_->tcp_handshakes++;
      counted_tcp = true;
    } else {
      // --max-clients clients at most, taken at their Hello (ClientHandler::handshake: a connection in its handshake
      // is not known to be a client yet, review N9), and kStatusQueryReserve more local connections for status
      // queries (r11): `lmcache-adp status --gateway` still answers on a full gateway (review r15 N2). Here, the
      // bound of them all, those in their handshake included: a flood of half-open connections holds no more. A
      // status query within --max-clients is not counted (r16: bounded at its Hello by --max-clients with the
      // clients; counted here, one connected before the clients filled the gateway kept the operator's out).
      Open open = open_connections(true);
      const size_t bound = static_cast<size_t>(opts_.max_clients) + kStatusQueryReserve;
      if (open.bounded() >= bound) open = open_connections(true, true);  // at the bound: those on their way out apart
      if (open.bounded() >= bound) {
        shared_->refused++;
        ADP_WARN_LIMITED(
            "gateway: refusing a local connection: %zu clients and %zu status queries on the reserve connected "
            "already%s (--max-clients %d, and %d more for status queries)",
            open.clients, open.reserve_queries, open.handshakes_text().c_str(), opts_.max_clients, kStatusQueryReserve);
        proto::refuse_at_accept(fd, "%s (%d, --max-clients)", proto::kTooManyLocalClients, opts_.max_clients);
        return 0;
      }
    }
    Client& c = clients_.emplace_back();
    entered = true;
    c.id = next_client_++;
    c.fd = fd;
    c.tcp = tcp;
    c.control = std::make_shared<ConnectionControl>();
    start_connection(c);
  } catch (const std::exception& e) {
    if (entered) clients_.pop_back();  // no thread was started for it
    if (counted_tcp) shared_->tcp_handshakes--;
    shared_->refused++;
    const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    const char* why = memory ? "out of memory: std::bad_alloc" : e.what();
    ADP_WARN_LIMITED("gateway: refusing a %s connection: cannot start its thread (%s)", tcp ? "TCP" : "local", why);
    proto::refuse_at_accept(fd, "the gateway cannot start a thread for this connection (%s)", why);
  }
  return 0;
}

void GatewayServer::start_connection(Client& c) {
  const int fd = c.fd;
  const bool tcp = c.tcp;
  c.thread = std::thread([this, &c, fd, tcp, id = c.id, shared = shared_, control = c.control] {
    set_thread_name("adp-conn", static_cast<int>(id % 1000000));
    ClientHandler(fd, tcp, id, shared, control).run();
    // Tests only (ADP_TEST_CONN_END_DELAY_MS): the thread ends this long after its teardown (or at stop()).
    for (auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(shared->hooks.conn_end_delay_ms);
         std::chrono::steady_clock::now() < until && !control->stopping.load(std::memory_order_relaxed);)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::lock_guard<std::mutex> l(control->mu);
    if (control->abandoned) {
      // stop() went on without this thread (reap): the server, its card and
      // this Client may be gone. Only what the thread owns is left to close.
      ::close(fd);
      return;
    }
    control->done = true;
    c.done = true;
    wake();  // so its thread and descriptor are reaped now, not at the next connect
  });
}

void GatewayServer::reap(bool all) {
  std::list<Client> finished;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = clients_.begin(); it != clients_.end();) {
      auto next = std::next(it);
      if (all) {
        it->control->stopping = true;  // the batch in progress ends at its next item, chunk or transfer
        ::shutdown(it->fd, SHUT_RDWR);
      }
      if (all || it->done) finished.splice(finished.end(), clients_, it);
      it = next;
    }
  }
  if (!all) {
    for (Client& c : finished) {
      c.thread.join();
      ::close(c.fd);
    }
    return;
  }
  // Stopping: every thread ends at its batch's next item, chunk or piece
  // (`stopping`: the socket is shut down, so no reply could go out), except one stalled in a transfer of its client's
  // memory (process_vm_readv/writev of a buffer the client does not serve: no time limit, no signal short of killing
  // the gateway ends it). Such a thread holds no I/O context, no card space and no pin, so after kStallGiveUp in one
  // transfer it is left behind: it owns its socket from then on and, when the transfer ends, touches nothing of the
  // server's (ClientHandler's in_client_memory). The process's exit ends it.
  constexpr auto kStallGiveUp = std::chrono::seconds(2);
  while (!finished.empty()) {
    for (auto it = finished.begin(); it != finished.end();) {
      auto next = std::next(it);
      Client& c = *it;
      bool give_up = false;
      double stalled_s = 0;
      {
        std::lock_guard<std::mutex> l(c.control->mu);
        const auto since = std::chrono::steady_clock::now() - c.control->transfer_since;
        if (!c.control->done && c.control->in_transfer && since >= kStallGiveUp) {
          c.control->abandoned = true;
          give_up = true;
          stalled_s = std::chrono::duration<double>(since).count();
        }
      }
      if (give_up) {
        ucred cred{};
        socklen_t len = sizeof cred;
        ::getsockopt(c.fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
        ADP_WARN(
            "gateway: stopping without client #%llu (pid %d): its thread has been stalled %.1f s in a transfer of the "
            "client's memory (a buffer the client does not serve, e.g. on a FUSE file or a userfaultfd range); its "
            "batch is abandoned, the thread is left behind and ends with the transfer or this process",
            static_cast<unsigned long long>(c.id), static_cast<int>(cred.pid), stalled_s);
        c.thread.detach();
        finished.erase(it);
      } else if (c.done) {
        c.thread.join();
        ::close(c.fd);
        finished.erase(it);
      }
      it = next;
    }
    if (!finished.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

namespace {
// A backlog of clients gone before their HelloOk is accepted within a moment (a stopped gateway resumed): their
// count line waits this long after the first, so that it counts them all; then at most one line per kGoneLineEvery.
constexpr auto kGoneGather = std::chrono::seconds(1);
constexpr auto kGoneLineEvery = std::chrono::seconds(10);
}  // namespace

int GatewayServer::log_gone_clients(bool at_once) {
  const uint64_t gone = shared_->gone_before_hello_ok.load(std::memory_order_relaxed);
  if (gone == gone_logged_) return -1;
  const auto now = proto::Clock::now();
  if (gone_first_ == proto::Clock::time_point{}) {
    gone_first_ = now;
    gone_due_ = std::max(now + kGoneGather, gone_last_line_ + kGoneLineEvery);
  }
  if (!at_once && now < gone_due_)
    return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(gone_due_ - now).count());
  const uint64_t n = gone - gone_logged_;
  const long long s = std::max<long long>(1, std::llround(std::chrono::duration<double>(now - gone_first_).count()));
  ADP_INFO(
      "gateway: %llu %s in the last %lld s (%s before the gateway answered, such as those queued while it was "
      "stopped; ADP_LOG_LEVEL=DEBUG logs each)",
      static_cast<unsigned long long>(n),
      n == 1 ? "client gone before its handshake" : "clients gone before their handshake", s,
      n == 1 ? "its connect gave up" : "their connects gave up");
  gone_logged_ = gone;
  gone_first_ = {};
  gone_last_line_ = now;
  return -1;
}

void GatewayServer::accept_paused(int err) {
  const auto now = proto::Clock::now();
  accept_backoff_ = std::clamp(accept_backoff_ * 2, kAcceptFirstBackoff, kAcceptMaxBackoff);
  accept_resume_ = now + accept_backoff_;
  shared_->accept_backoffs.fetch_add(1, std::memory_order_relaxed);
  if (accept_paused_since_ != proto::Clock::time_point{}) return;  // one line an episode
  accept_paused_since_ = now;
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  // Made with no allocation (no std::string): an exception on this thread ends the gateway, and ENOMEM is one cause.
  const char* what = err == EMFILE    ? "EMFILE, this process's open-file limit (RLIMIT_NOFILE) reached"
                     : err == ENFILE  ? "ENFILE, the system's open-file limit (fs.file-max) reached"
                     : err == ENOBUFS ? "ENOBUFS, no kernel memory for the socket"
                                      : "ENOMEM, no kernel memory for the socket";
  ADP_WARN(
      "gateway: cannot accept connections: %s (RLIMIT_NOFILE %llu soft, %llu hard, %d connections open): new "
      "connections wait in the listen backlog; accepting again every %lld ms at most until one is accepted "
      "(accept_backoffs)",
      what, static_cast<unsigned long long>(nofile.rlim_cur), static_cast<unsigned long long>(nofile.rlim_max),
      static_cast<int>(clients_.size()), static_cast<long long>(kAcceptMaxBackoff.count()));
}

void GatewayServer::accept_loop() {
  set_thread_name("adp-gw-accept");
  while (!stopping_) {
    pollfd p[3] = {{wake_fd_, POLLIN, 0}, {unix_fd_, POLLIN, 0}, {tcp_fd_, POLLIN, 0}};
    // Woken by each client's end (reaped here): the count line of those gone before their HelloOk goes when due.
    int timeout = log_gone_clients(false);
    // Paused after an accept failed for want of descriptors or memory (accept_paused): the listening sockets stay
    // readable with the connection left in the backlog, so polling them woke this thread at once, again and again:
    // a full CPU until a descriptor came free (review33b F3). Only the wake-up is polled until the pause ends.
    int listening = tcp_fd_ >= 0 ? 3 : 2;
    if (accept_resume_ != proto::Clock::time_point{}) {
      const auto now = proto::Clock::now();
      if (now < accept_resume_) {
        listening = 1;
        const int left = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(accept_resume_ - now).count());
        timeout = timeout < 0 ? left : std::min(timeout, left);
      } else {
        accept_resume_ = {};
      }
    }
    int r = ::poll(p, listening, timeout);
    if (r < 0) continue;  // EINTR
    if (p[0].revents) {
      uint64_t v;
      ssize_t rd = ::read(wake_fd_, &v, sizeof v);
      (void)rd;
    }
    if (stopping_) break;
    int err = 0;
    if (listening > 1 && (p[1].revents & POLLIN)) err = accept_one(unix_fd_, false);
    if (!err && listening > 2 && (p[2].revents & POLLIN)) err = accept_one(tcp_fd_, true);
    reap(false);  // first: a descriptor given back here may end the pause
    if (err) {
      accept_paused(err);
    } else if (listening > 1 && accept_paused_since_ != proto::Clock::time_point{} &&
               (p[1].revents | (listening > 2 ? p[2].revents : 0)) & POLLIN) {
      // An accept went through (or found nothing pending) after a pause: the episode is over.
      const double s = std::chrono::duration<double>(proto::Clock::now() - accept_paused_since_).count();
      ADP_INFO("gateway: accepting connections again after %.1f s out of descriptors or memory", s);
      accept_paused_since_ = {};
      accept_backoff_ = {};
    }
  }
  // The stop. Nothing here allocates but the card's close (~CardStore's pad, done without: it logs the ERROR "no
  // memory to pad the frontier region's tail at close: the next open pads it"): an exception out of this thread's
  // function is std::terminate, the card left as a crash leaves it and the socket file in place (session 29: the
  // stopping line's handshake count was a std::string; tests/cpp/thread_alloc_test.cc part gateway_stop fails each
  // allocation of this stop in turn). Step by step: the stopping line's counts are made in place (Open::Text); the
  // prefaulter's stop allocates nothing (session 28); reap(true) splices the list's nodes, joins and closes;
  // log_gone_clients formats into log_message's buffer; shutdown_store closes the pool (~IoContext allocates nothing)
  // and the card. Left unhandled: std::system_error from a mutex or a join (EDEADLK, EINVAL: not reachable here,
  // each thread joined once by this thread, none by itself).
  {
    std::unique_lock<std::mutex> l(mu_);
    const Open open = open_connections(false);
    l.unlock();
    const size_t queries = open.status_queries + open.reserve_queries;
    if (queries == 0)
      ADP_INFO("gateway: stopping (%zu clients connected%s)", open.clients, open.handshakes_text().c_str());
    else
      ADP_INFO("gateway: stopping (%zu clients and %zu status queries connected%s)", open.clients, queries,
               open.handshakes_text().c_str());
  }
  if (shared_->segment_prefault) shared_->segment_prefault->stop();  // within one piece
  reap(true);
  log_gone_clients(true);
  shutdown_store();
}

void GatewayServer::shutdown_store() {
  // Only the socket this gateway made: the path may name another gateway's by now (this one's removed, by hand or
  // a cleaner, and a gateway started on the path since), which it would have cut off from every new client.
  if (struct stat sock; unix_fd_ >= 0 && ::lstat(unix_ep_.path.c_str(), &sock) == 0) {
    if (sock.st_dev == socket_dev_ && sock.st_ino == socket_ino_)
      ::unlink(unix_ep_.path.c_str());
    else
      ADP_WARN("gateway: %s is no longer the socket this gateway made (another took its path): left in place",
               unix_ep_.path.c_str());
  }
  for (int* fd : {&unix_fd_, &tcp_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  // No connection's or helper's thread may be in the card or the pool from
  // here on: a thread stop() left behind in a transfer of its client's
  // memory finds the gate closed when the transfer ends. Inside it is card
  // work, and a pipelined store's wait for its reader's next piece, which is
  // bounded (200 ms a piece, 200 ms plus the object's bytes at 512 MiB/s an
  // object; stop() ends the reader at its next transfer), so this wait is
  // short.
  if (shared_) shared_->gate.close();
  pool_.reset();  // seals the open regions, before the store goes
  std::unique_ptr<CardStore> store;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (store_) final_stats_ = store_->stats();
    store = std::move(store_);
  }
  if (store) {
    store.reset();
    ADP_INFO("gateway: card %s closed (%llu batches served)", opts_.card.path.c_str(),
             static_cast<unsigned long long>(shared_ ? shared_->batches.load() : 0));
  }
  std::lock_guard<std::mutex> l(mu_);
  stopped_ = true;
  stopped_cv_.notify_all();
}

}  // namespace adp
