// SPDX-License-Identifier: Apache-2.0
// A load through the ring in pieces (protocol r4) whose deadline passes while
// pieces keep coming: two protections keep them out of LMCache's buffer, and
// each is checked here on its own (the end-to-end tests in
// tests/gateway/test_ring_pieces.py see only both together):
//
//   1. the client session looks at the deadline before each piece
//      (RemoteSession::call_in_pieces): driven against a gateway double with
//      a delivery that accepts every piece (no connector, so no guard). The
//      double publishes the next piece from inside each delivery (20 ms
//      each, 64 pieces), so the session always finds a piece waiting and
//      never reaches its idle-time deadline check: only the per-piece check
//      stops it. No piece may start after the deadline (300 ms).
//   2. the connector's guard (a delivery after the future completed is
//      declined): driven with a backend double whose session delivers a
//      piece every 20 ms for 1 s whatever the deadline (300 ms), as a
//      session without protection 1 would. Once the future has failed, no
//      byte may change in the buffer.
//
//   ring_deadline_test <dir for the double's socket>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "connector/connector.h"
#include "protocol/messages.h"
#include "protocol/socket_io.h"
#include "transport/remote_backend.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kPieces = 64;
constexpr size_t kPieceBytes = 64 << 10;
constexpr size_t kObjectBytes = kPieces * kPieceBytes;
constexpr milliseconds kPieceEvery{20};
constexpr milliseconds kDeadline{300};
constexpr uint8_t kOld = 0x11, kNew = 0x77;

// A gateway that grants the ring and ring progress, takes one get, publishes
// its first piece and then each next piece when asked (publish_next), and
// never replies.
class GatewayDouble {
 public:
  explicit GatewayDouble(const std::string& path) {
    ep_.kind = adp::proto::Endpoint::Kind::kUnix;
    ep_.path = path;
    adp::Status s = adp::proto::listen_endpoint(&ep_, 1, &listen_fd_);
    CHECK(s.ok(), "listen: %s", s.message().c_str());
    thread_ = std::thread([this] { serve(); });
  }
  ~GatewayDouble() {
    stop_ = true;
    thread_.join();
    if (ring_) ::munmap(ring_, ring_bytes_);
    ::close(listen_fd_);
  }
  const adp::proto::Endpoint& endpoint() const { return ep_; }
  bool ready() const { return ready_.load(); }
  // Writes piece `published_` of the object into the ring, then its slot and
  // the ticket, as the gateway does (release order: bytes before the slot).
  void publish_next() {
    if (!ready_ || published_ == kPieces) return;
    std::memset(ring_ + offset_ + published_ * kPieceBytes, kNew, kPieceBytes);
    published_++;
    auto* slot = reinterpret_cast<uint32_t*>(ring_ + adp::proto::kProgressSlotsAt);
    auto* ticket = reinterpret_cast<uint32_t*>(ring_ + adp::proto::kProgressTicketAt);
    __atomic_store_n(slot, static_cast<uint32_t>(published_ * kPieceBytes), __ATOMIC_RELEASE);
    __atomic_add_fetch(ticket, 1u, __ATOMIC_RELEASE);
  }
  size_t published() const { return published_; }

 private:
  void serve() {
    const auto by = Clock::now() + std::chrono::seconds(10);
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return;
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    adp::proto::Frame hello_frame, batch_frame;
    adp::proto::Hello hello;
    adp::Status s = adp::proto::read_frame(fd, adp::proto::kMaxHelloBodyBytes, by, &hello_frame, 1);
    if (s.ok()) s = adp::proto::decode_hello(hello_frame.body, &hello);
    CHECK(s.ok() && hello_frame.fds.size() == 1, "double: no hello with a ring: %s", s.message().c_str());
    if (!s.ok() || hello_frame.fds.size() != 1) return (void)::close(fd);
    ring_bytes_ = hello.ring_bytes;
    void* m = ::mmap(nullptr, ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, hello_frame.fds[0], 0);
    adp::proto::close_fds(&hello_frame.fds);
    ring_ = static_cast<uint8_t*>(m);
    adp::proto::HelloOk ok;
    ok.features = adp::proto::kFeatureRing | adp::proto::kFeatureRingProgress;
    ok.max_object_bytes = kObjectBytes;
    ok.server = "ring deadline double";
    std::vector<uint8_t> table;
    adp::proto::encode_hello_ok(ok, &table);
    s = adp::proto::write_frame(fd, adp::proto::FrameType::kHelloOk, hello_frame.header.request_id, table, {}, by);
    adp::proto::BatchRequest req;
    if (s.ok()) s = adp::proto::read_frame(fd, adp::proto::kMaxFrameBodyBytes, by, &batch_frame);
    if (s.ok()) s = adp::proto::decode_batch(batch_frame.body, &req);
    CHECK(s.ok() && req.op == adp::proto::Op::kGet && req.items.size() == 1 && req.items[0].size == kObjectBytes,
          "double: not the one get expected: %s", s.message().c_str());
    if (s.ok() && req.items.size() == 1) {
      offset_ = req.items[0].offset;
      ready_ = true;
      publish_next();
    }
    // Until the client hangs up (or the test ends): never a reply.
    while (!stop_) {
      pollfd c{fd, POLLIN, 0};
      char byte;
      if (::poll(&c, 1, 50) == 1 && ::recv(fd, &byte, 1, 0) <= 0) break;
    }
    ::close(fd);
  }

  adp::proto::Endpoint ep_;
  int listen_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false}, ready_{false};
  uint8_t* ring_ = nullptr;
  uint64_t ring_bytes_ = 0, offset_ = 0;
  size_t published_ = 0;  // the client's thread only, once ready_
};

// Protection 1 alone: the session's per-piece deadline check.
void session_stops_at_its_deadline(const std::string& dir) {
  GatewayDouble gw(dir + "/double.sock");
  adp::GatewayClientOptions opts;
  opts.endpoint = gw.endpoint();
  opts.ring_bytes = 8 << 20;
  opts.client_name = "ring_deadline_test";
  opts.segments = false;
  adp::RemoteBackend backend(opts);
  std::unique_ptr<adp::BackendSession> session = backend.new_session();

  std::vector<uint8_t> buf(kObjectBytes, kOld);
  const std::string_view key = "deadline@pieces";
  const size_t size = kObjectBytes;
  uint8_t* dst = buf.data();
  adp::Status result;
  const auto deadline = Clock::now() + kDeadline;
  size_t deliveries = 0, late = 0;
  bool past = false;  // a delivery saw the deadline pass before the next piece was published
  // Accepts every piece (no guard); each takes 20 ms, then the double
  // publishes the next one. A piece published after this delivery saw the
  // deadline pass must never be copied (no clock race: time only moves on).
  adp::DeliverFn deliver = [&](size_t, size_t n, const adp::CopyFn& copy) {
    deliveries++;
    late += past;
    std::this_thread::sleep_for(kPieceEvery);
    bool copied = n == size && copy(dst);
    past = Clock::now() >= deadline;
    gw.publish_next();
    return copied;
  };
  adp::GuardedReadFn guarded = [](const std::function<void()>& read) {
    read();
    return true;
  };
  session->get(&key, &size, &dst, 1, &result, deadline, deliver, guarded);

  CHECK(gw.ready(), "the double never got the get");
  CHECK(result.code() == adp::Status::Code::kTimedOut, "the load did not time out: %s", result.message().c_str());
  CHECK(late == 0, "%zu of %zu pieces were copied after the deadline", late, deliveries);
  CHECK(past, "no delivery saw the deadline pass: nothing was late");
  CHECK(deliveries >= 2 && deliveries < kPieces, "%zu pieces were copied (some, not all, were due)", deliveries);
  // What was copied is the published pieces' bytes; the rest is as it was.
  size_t copied = 0;
  while (copied < kObjectBytes && buf[copied] == kNew) copied++;
  bool rest_untouched = true;
  for (size_t i = copied; i < kObjectBytes; i++) rest_untouched &= buf[i] == kOld;
  CHECK(copied == deliveries * kPieceBytes && rest_untouched, "buffer holds %zu new bytes for %zu pieces copied",
        copied, deliveries);
  std::printf("session: %zu of %zu pieces copied, %zu after the deadline\n", deliveries, kPieces, late);
}

// A backend whose session delivers a piece every 20 ms for 1 s, whatever the
// deadline: a session without protection 1.
class LateBackend : public adp::Backend {
 public:
  class Session : public adp::BackendSession {
   public:
    explicit Session(LateBackend* b) : b_(b) {}
    void put(const adp::PutItem*, size_t n, adp::Status* results, adp::Deadline, const adp::GuardedReadFn&) override {
      for (size_t i = 0; i < n; i++) results[i] = adp::Status::InvalidArgument("loads only");
    }
    void get(const std::string_view*, const size_t* sizes, uint8_t* const*, size_t n, adp::Status* results,
             adp::Deadline, const adp::DeliverFn& deliver, const adp::GuardedReadFn&) override {
      for (size_t i = 0; i < n; i++) results[i] = adp::Status::NotFound();
      if (n != 1 || sizes[0] != kObjectBytes) return;
      bool all = true;
      for (size_t k = 0; k < kPieces / 2; k++) {  // 32 pieces: 640 ms
        std::this_thread::sleep_for(kPieceEvery);
        bool taken = deliver(0, kObjectBytes, [k](uint8_t* dst) {
          std::memset(dst + k * kPieceBytes, kNew, kPieceBytes);
          return true;
        });
        (taken ? b_->accepted : b_->declined)++;
        all &= taken;
      }
      results[0] = all ? adp::Status::Ok() : adp::Status::NotFound();
      b_->finished = true;
    }
    void exists(const std::string_view*, size_t n, adp::Status* results, adp::Deadline) override {
      for (size_t i = 0; i < n; i++) results[i] = adp::Status::NotFound();
    }
    void remove(const std::string_view*, size_t n, adp::Status* results, adp::Deadline) override {
      for (size_t i = 0; i < n; i++) results[i] = adp::Status::NotFound();
    }

   private:
    LateBackend* b_;
  };
  std::unique_ptr<adp::BackendSession> new_session() override { return std::make_unique<Session>(this); }
  std::string describe() const override { return "late pieces double"; }
  adp::StoreStats stats() const override { return {}; }

  std::atomic<int> accepted{0}, declined{0};
  std::atomic<bool> finished{false};
};

// Protection 2 alone: the connector declines a delivery after the future completed.
void connector_declines_after_completion() {
  auto owned = std::make_unique<LateBackend>();
  LateBackend* backend = owned.get();
  adp::ConnectorOptions opts;
  opts.num_workers = 1;
  opts.timeout_ms = static_cast<int>(kDeadline.count());
  adp::Connector c(std::move(owned), opts);
  std::vector<uint8_t> buf(kObjectBytes, kOld);
  const uint64_t id = c.submit(adp::OpType::kGet, {"deadline@late"}, {{buf.data(), buf.size()}}, nullptr);
  adp::Completion done{};
  bool completed = false;
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (!completed && Clock::now() < give_up) {
    pollfd p{c.event_fd(), POLLIN, 0};
    ::poll(&p, 1, 5);
    for (auto& d : c.drain())
      if (d.future_id == id) done = std::move(d), completed = true;
  }
  const std::vector<uint8_t> at_completion = buf;
  CHECK(completed && !done.ok && done.per_key == std::vector<uint8_t>{0}, "the load did not fail: ok %d, %s", done.ok,
        done.error.c_str());
  CHECK(!backend->finished, "the session finished before the deadline: nothing was late");
  while (!backend->finished && Clock::now() < give_up) std::this_thread::sleep_for(milliseconds(10));
  CHECK(backend->finished, "the session did not finish");
  CHECK(buf == at_completion, "bytes landed after the future failed");
  CHECK(backend->accepted > 0 && backend->declined > 0, "accepted %d pieces, declined %d (both expected)",
        backend->accepted.load(), backend->declined.load());
  std::printf("connector: %d pieces accepted, %d declined after the future completed\n", backend->accepted.load(),
              backend->declined.load());
  c.close();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  session_stops_at_its_deadline(argv[1]);
  connector_declines_after_completion();
  return adp::testing::finish("ring_deadline_test");
}
