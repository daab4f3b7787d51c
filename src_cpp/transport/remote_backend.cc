// SPDX-License-Identifier: Apache-2.0
#include "transport/remote_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "util/log.h"

namespace adp {
namespace {

using proto::Clock;
using std::chrono::milliseconds;

constexpr milliseconds kConnectTimeout{2000};
constexpr milliseconds kFirstBackoff{50}, kMaxBackoff{2000};

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Whether a failed call says the gateway (not just this request) is in trouble.
bool link_failure(const Status& s) { return s.code() != Status::Code::kTimedOut; }

}  // namespace

// What one operation sends: keys, the payload room each needs (put: its
// bytes; get: the caller's buffer) and, for put, where the bytes are.
struct RoundInput {
  proto::Op op;
  const std::string_view* keys;
  const size_t* sizes;           // null for exists/delete
  const uint8_t* const* src;     // put only
  const GuardedReadFn* guarded;  // put only: src is read only inside it
};

// Receives each key's outcome; data points at a get's bytes (ring or reply).
using FinishFn = std::function<void(size_t i, const Status& st, const uint8_t* data, size_t size)>;

class RemoteSession : public BackendSession {
 public:
  explicit RemoteSession(RemoteBackend* backend) : backend_(backend) {}
  ~RemoteSession() override { backend_->drop(&client_); }

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
    run({proto::Op::kPut, keys.data(), sizes.data(), src.data(), &guarded}, n, deadline,
        [&](size_t i, const Status& st, const uint8_t*, size_t) {
          results[i] = st;
          (st.ok() ? c.stores : c.store_failures).fetch_add(1, std::memory_order_relaxed);
          if (st.ok()) c.bytes_written.fetch_add(sizes[i], std::memory_order_relaxed);
        });
  }

  void get(const std::string_view* keys, const size_t* sizes, size_t n, Status* results, Deadline deadline,
           const DeliverFn& deliver) override {
    auto& c = backend_->counters_;
    run({proto::Op::kGet, keys, sizes, nullptr, nullptr}, n, deadline,
        [&](size_t i, const Status& st, const uint8_t* data, size_t size) {
          // The gateway checked the payload against its CRC before replying.
          auto copy = [data, size](uint8_t* dst) {
            std::memcpy(dst, data, size);
            return true;
          };
          results[i] = st.ok() && !deliver(i, size, copy) ? Status::NotFound("not delivered") : st;
          (results[i].ok() ? c.hits : c.misses).fetch_add(1, std::memory_order_relaxed);
          if (results[i].ok()) c.bytes_read.fetch_add(size, std::memory_order_relaxed);
        });
  }

  void exists(const std::string_view* keys, size_t n, bool* found, Deadline deadline) override {
    run({proto::Op::kExists, keys, nullptr, nullptr, nullptr}, n, deadline,
        [&](size_t i, const Status& st, const uint8_t*, size_t) { found[i] = st.ok(); });
  }

  void remove(const std::string_view* keys, size_t n, bool* removed, Deadline deadline) override {
    auto& c = backend_->counters_;
    run({proto::Op::kDelete, keys, nullptr, nullptr, nullptr}, n, deadline,
        [&](size_t i, const Status& st, const uint8_t*, size_t) {
          removed[i] = st.ok();
          if (st.ok()) c.deletes.fetch_add(1, std::memory_order_relaxed);
        });
  }

 private:
  Status connected(Deadline deadline);
  void lose(const Status& why);
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

  RemoteBackend* backend_;
  std::unique_ptr<GatewayClient> client_;
  bool fresh_ = false;  // connected, no call made on it yet
  Clock::time_point retry_at_{};
  milliseconds backoff_{0};
  Status last_error_;
  std::vector<uint8_t> staging_;  // TCP put: the round's bytes, copied under the guard
};

Status RemoteSession::connected(Deadline deadline) {
  if (client_) return Status::Ok();
  auto now = Clock::now();
  if (now >= deadline) return Status::TimedOut("deadline passed before the gateway was reached");
  if (now < retry_at_) return last_error_;
  Status s = backend_->connect(std::min<Deadline>(deadline, now + kConnectTimeout), &client_);
  if (!s.ok()) {
    backoff_ = std::clamp(backoff_ * 2, kFirstBackoff, kMaxBackoff);
    retry_at_ = now + backoff_;
    last_error_ = Status::Unavailable(backend_->describe() + " unavailable: " + s.message());
    backend_->note_down(s);
    return last_error_;
  }
  backoff_ = milliseconds{0};
  fresh_ = true;
  return Status::Ok();
}

void RemoteSession::lose(const Status& why) {
  backend_->drop(&client_);
  if (link_failure(why))
    backend_->note_down(why);
  else
    ADP_DEBUG("%s: %s; reconnecting", backend_->describe().c_str(), log_safe(why.message()).c_str());
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
  uint64_t used = 0;
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
    bool stale = !fresh_;
    fresh_ = false;
    s = client_->call(req, iov, deadline, &reply);
    if (s.ok()) s = finish_round(in, begin, req, reply, finish);
    if (!s.ok()) {
      lose(s);
      // A connection that died while idle (gateway restarted) gets one more try on a new one.
      if (stale && !retried && s.code() == Status::Code::kClosed) {
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

RemoteBackend::RemoteBackend(GatewayClientOptions opts) : opts_(std::move(opts)) {
  if (const char* d = std::getenv("ADP_TEST_PUT_COPY_DELAY_MS")) test_put_delay_ = milliseconds(std::atoi(d));
}

std::unique_ptr<BackendSession> RemoteBackend::new_session() { return std::make_unique<RemoteSession>(this); }

Status RemoteBackend::connect(proto::Deadline deadline, std::unique_ptr<GatewayClient>* out) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (interrupted_) return Status::Closed("connector closed");
  }
  std::unique_ptr<GatewayClient> c;
  Status s = GatewayClient::Connect(opts_, deadline, &c);
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (interrupted_) return Status::Closed("connector closed");
    live_.insert(c.get());
  }
  if (link_.exchange(Link::kUp) != Link::kUp)
    ADP_INFO("%s: connected (%s, %s)", describe().c_str(), log_safe(c->server()).c_str(),
             c->ring() ? ("ring " + std::to_string(c->ring()->size() >> 20) + " MiB per connection").c_str()
                       : "payload inline");
  *out = std::move(c);
  return Status::Ok();
}

void RemoteBackend::drop(std::unique_ptr<GatewayClient>* client) {
  if (!*client) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    live_.erase(client->get());
  }
  client->reset();
}

void RemoteBackend::note_down(const Status& why) {
  if (link_.exchange(Link::kDown) != Link::kDown)
    ADP_WARN("%s: %s; its requests fail until it is back (reconnecting with back-off)", describe().c_str(),
             log_safe(why.message()).c_str());
}

void RemoteBackend::interrupt() {
  std::lock_guard<std::mutex> l(mu_);
  interrupted_ = true;
  for (const GatewayClient* c : live_) c->interrupt();
}

StoreStats RemoteBackend::stats() const {
  StoreStats s;
  counters_.copy_to(&s);
  return s;
}

}  // namespace adp
