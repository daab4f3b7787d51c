// SPDX-License-Identifier: Apache-2.0
// RemoteBackend itself: its construction and test hooks, the connections
// (connect, the spare, drop), the link's state and its log lines (note_down,
// the refusals no retry heals), the gateway's stall and card health, the
// background reconnect and its idle status query, the connect watch that
// interrupt() ends, and stats(). Not here: a worker's session
// (remote_session.cc), its in-place path and the segment cache
// (remote_in_place.cc), its waits for replies (remote_reply_wait.cc).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "transport/card_io_error.h"
#include "transport/remote_session.h"
#include "util/log.h"
#include "util/piece_pool.h"
#include "util/thread_name.h"

namespace adp {
namespace {

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

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

// The test hooks read once, at construction (the Connector built on this
// backend logs those set).
RemoteBackend::RemoteBackend(GatewayClientOptions opts) : RemoteBackend(std::move(opts), read_test_hooks()) {}

RemoteBackend::RemoteBackend(GatewayClientOptions opts, const TestHooks& hooks)
    : opts_([&] {
        opts.test_yama_ptrace_scope = hooks.yama_ptrace_scope;
        opts.test_no_peer_pidfd = hooks.no_peer_pidfd;
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
  test_no_procmap_query_ = hooks.no_procmap_query;
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
    // Reachable (its connection, if any, not taken yet). note_down wakes it (the predicate, looked at under mu_
    // before each sleep, also catches a link_ set down without mu_ since the look above); idle_look_ paces the look
    // at idle connections. Only those two end the wait: every connect notifies too (note_connected's
    // start_reconnect), and a look on that wake-up came at a time set by the scheduler, not idle_look_ (session
    // 34: on a loaded host a session's reconnect woke it, it ran after the gateway was stopped again, and its
    // failed status query logged the outage that the test's next request, a delete, was to log;
    // test_a_tcp_restart_within_the_idle_check_retries_lookups_quietly_and_deletes_loudly failed 5 runs in 13
    // under 2 busy loops, ADP_TEST_IDLE_LOOK_MS notwithstanding).
    backoff = milliseconds{0};
    reconnect_cv_.wait_for(l, idle_look_, [&] { return interrupted_ || link_.load() == Link::kDown; });
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
