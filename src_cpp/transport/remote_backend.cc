// SPDX-License-Identifier: Apache-2.0
#include "transport/remote_backend.h"

#include <algorithm>
#include <cstring>

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
  const size_t* sizes;        // null for exists/delete
  const uint8_t* const* src;  // put only
};

// Receives each key's outcome; data points at a get's bytes (ring or reply).
using FinishFn = std::function<void(size_t i, const Status& st, const uint8_t* data, size_t size)>;

class RemoteSession : public BackendSession {
 public:
  explicit RemoteSession(RemoteBackend* backend) : backend_(backend) {}
  ~RemoteSession() override { backend_->drop(&client_); }

  void put(const PutItem* items, size_t n, Status* results, Deadline deadline,
           const std::function<bool()>& still_wanted) override {
    std::vector<std::string_view> keys(n);
    std::vector<size_t> sizes(n);
    std::vector<const uint8_t*> src(n);
    for (size_t i = 0; i < n; i++) {
      keys[i] = items[i].key;
      sizes[i] = items[i].size;
      src[i] = items[i].data;
    }
    auto& c = backend_->counters_;
    run({proto::Op::kPut, keys.data(), sizes.data(), src.data()}, n, deadline, still_wanted,
        [&](size_t i, const Status& st, const uint8_t*, size_t) {
          results[i] = st;
          (st.ok() ? c.stores : c.store_failures).fetch_add(1, std::memory_order_relaxed);
          if (st.ok()) c.bytes_written.fetch_add(sizes[i], std::memory_order_relaxed);
        });
  }

  void get(const std::string_view* keys, const size_t* sizes, size_t n, Status* results, Deadline deadline,
           const DeliverFn& deliver) override {
    auto& c = backend_->counters_;
    run({proto::Op::kGet, keys, sizes, nullptr}, n, deadline, nullptr,
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
    run({proto::Op::kExists, keys, nullptr, nullptr}, n, deadline, nullptr,
        [&](size_t i, const Status& st, const uint8_t*, size_t) { found[i] = st.ok(); });
  }

  void remove(const std::string_view* keys, size_t n, bool* removed, Deadline deadline) override {
    auto& c = backend_->counters_;
    run({proto::Op::kDelete, keys, nullptr, nullptr}, n, deadline, nullptr,
        [&](size_t i, const Status& st, const uint8_t*, size_t) {
          removed[i] = st.ok();
          if (st.ok()) c.deletes.fetch_add(1, std::memory_order_relaxed);
        });
  }

 private:
  Status connected(Deadline deadline);
  void lose(const Status& why);
  // Lays out the round starting at `begin` for the current connection;
  // returns its end (== begin when item `begin` fits no round).
  size_t plan_round(const RoundInput& in, size_t begin, size_t n, proto::BatchRequest* req, std::vector<iovec>* iov);
  void run(const RoundInput& in, size_t n, Deadline deadline, const std::function<bool()>& still_wanted,
           const FinishFn& finish);
  // Hands the reply of one round to finish(); Ok unless the reply lies.
  Status finish_round(const RoundInput& in, size_t begin, const proto::BatchRequest& req,
                      const proto::BatchReply& reply, const FinishFn& finish);

  RemoteBackend* backend_;
  std::unique_ptr<GatewayClient> client_;
  bool fresh_ = false;  // connected, no call made on it yet
  Clock::time_point retry_at_{};
  milliseconds backoff_{0};
  Status last_error_;
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
    ADP_DEBUG("%s: %s; reconnecting", backend_->describe().c_str(), why.message().c_str());
}

size_t RemoteSession::plan_round(const RoundInput& in, size_t begin, size_t n, proto::BatchRequest* req,
                                 std::vector<iovec>* iov) {
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
    if (!in.src) continue;
    if (ring)
      std::memcpy(ring->data() + offset, in.src[end], size);
    else
      iov->push_back({const_cast<uint8_t*>(in.src[end]), size});
  }
  return end;
}

void RemoteSession::run(const RoundInput& in, size_t n, Deadline deadline, const std::function<bool()>& still_wanted,
                        const FinishFn& finish) {
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
    if (still_wanted && !still_wanted()) return fail_rest(Status::TimedOut("deadline passed"));
    s = connected(deadline);
    if (!s.ok()) return fail_rest(s);
    size_t end = plan_round(in, begin, n, &req, &iov);
    if (end == begin) {
      std::string limit = client_->ring() ? "the ring (raise ring_mb)" : "one frame's payload";
      finish(begin,
             Status::InvalidArgument("object of " + std::to_string(in.sizes[begin]) + " bytes is larger than " + limit),
             nullptr, 0);
      begin++;
      continue;
    }
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    req.timeout_ms = static_cast<uint32_t>(std::clamp<long long>(left, 1, UINT32_MAX));
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
  const uint8_t* inline_data = reply.payload.data();
  size_t inline_left = reply.payload.size();
  for (size_t k = 0; k < req.items.size(); k++) {
    const proto::ItemResult& r = reply.results[k];
    if (in.op != proto::Op::kGet || !r.status.ok()) {
      finish(begin + k, r.status, nullptr, 0);
      continue;
    }
    const proto::BatchItem& it = req.items[k];
    if (r.size != it.size || (!ring && r.size > inline_left))
      return Status::InvalidArgument("gateway reply disagrees with the request");
    const uint8_t* data = ring ? ring->data() + it.offset : inline_data;
    if (!ring) {
      inline_data += r.size;
      inline_left -= r.size;
    }
    finish(begin + k, r.status, data, r.size);
  }
  return Status::Ok();
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
    ADP_INFO("%s: connected (%s, %s)", describe().c_str(), c->server().c_str(),
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
             why.message().c_str());
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
