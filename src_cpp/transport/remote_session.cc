// SPDX-License-Identifier: Apache-2.0
// A worker's session with the gateway (RemoteSession) through the ring (Unix
// socket) or inline (TCP): its connection (the start-up connect, its
// back-off, a connection lost) and an operation's rounds (plan_round, run,
// finish_round, and a get's pieces as they land, call_in_pieces). Not here:
// the class itself (remote_session.h), the in-place path
// (remote_in_place.cc), the waits for a reply (remote_reply_wait.cc).
#include "transport/remote_session.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "util/log.h"
#include "util/thread_name.h"

namespace adp {
namespace {

// A batch that needs a connection while the start-up connect (prepare) is
// still being made waits for it this long at most (half its time left, if
// less), then connects on its own: a gateway that answers the handshake
// within it gives the batch that connection (no second one), and one that
// leaves it unanswered holds the batch no longer than this.
constexpr milliseconds kStartWait{100};

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Whether a failed call says the gateway (not just this request) is in trouble.
bool link_failure(const Status& s) { return s.code() != Status::Code::kTimedOut; }

}  // namespace

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

}  // namespace adp
