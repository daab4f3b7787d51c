// SPDX-License-Identifier: Apache-2.0
#include "gateway/client_handler.h"

#include <linux/futex.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <type_traits>

#include "protocol/auth.h"
#include "util/load_profile.h"
#include "util/log.h"
#include "util/thread_name.h"

namespace adp {
namespace {

using proto::Clock;

namespace {
// ADP_TEST_PROCESS_WRITE_STALL_MS: taken by the first process write that stalls.
std::atomic<bool> g_process_stall_taken{false};
// ADP_TEST_PROCESS_READ_STALL_MS: taken by the first process read that stalls.
std::atomic<bool> g_process_read_stall_taken{false};
}  // namespace

// Whether this thread is inside shared->gate (CardGate): a connection's
// thread is for its batch, a piece for its card part; both leave it for
// every wait on the client (except a pipelined store's wait for its reader's
// next piece, bounded by its card place's hold) and come back only while the
// gate is open.
thread_local bool t_in_card = false;
// Whether this thread is a connection's store reader (tests: which reads wait).
thread_local bool t_store_reader = false;

bool card_enter(CardGate& gate) {
  if (!t_in_card) t_in_card = gate.enter();
  return t_in_card;
}

void card_leave(CardGate& gate) {
  if (t_in_card) gate.leave();
  t_in_card = false;
}

// Inside the gate for a scope (already inside: stays so after it).
class CardSection {
 public:
  explicit CardSection(CardGate& gate) : gate_(gate), outer_(t_in_card), ok_(card_enter(gate)) {}
  ~CardSection() {
    if (!outer_) card_leave(gate_);
  }
  CardSection(const CardSection&) = delete;
  CardSection& operator=(const CardSection&) = delete;
  explicit operator bool() const { return ok_; }

 private:
  CardGate& gate_;
  const bool outer_, ok_;
};

unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }

bool fits(uint64_t offset, uint64_t len, uint64_t area) { return offset <= area && len <= area - offset; }

// A put is written in chunks of at most this much, its deadline checked between.
constexpr size_t kPutChunkItems = 64;
constexpr uint64_t kPutChunkBytes = 16ull << 20;
// r5 stores: the client's memory is read in pieces of this size, each under
// the lease, the client's liveness checked before each.
constexpr size_t kProcessReadPieceBytes = 1u << 20;
// r5 stores: a store buffer is given back once its connection sent nothing
// for this long (mapped again, populated, by its next store).
constexpr int kStoreBufferIdleMs = 5000;
// Session eight: a process store of one object of at least this size on a
// memory-speed card is read by the connection's store reader while the
// connection's thread copies each piece into its reserved card place (the
// second pass then reads the cache, not memory: benchmarks/README.md,
// "Session eight: stores"); smaller objects go through the buffer whole.
// ADP_STORE_PIPELINE_MIN_MB (the gateway's environment) sets it; 0 turns it
// off (an A/B of the two paths in one run: benchmarks/README.md).
constexpr uint64_t kPipelineMinBytes = 8ull << 20;
uint64_t pipeline_min_bytes() {
  static const uint64_t v = [] {
    const char* e = std::getenv("ADP_STORE_PIPELINE_MIN_MB");
    return e ? std::strtoull(e, nullptr, 10) << 20 : kPipelineMinBytes;
  }();
  return v;
}
// Session eight (loads, larger pieces): with ADP_BOUNCE_PIECE_KB (the
// gateway's environment; a multiple of 4 up to 1024, e.g. 1024) an object
// that no helper may join when its load starts (no pool, or
// PiecePool::helpers_now() false: 16 connections on 16 CPUs) is written by
// its connection's thread alone in pieces of that size, fewer and larger
// process_vm_writev calls; helpers then do not join it even if one comes
// free later. Unset (or 256): every object in CardStore::kBouncePieceBytes
// pieces with helpers as before, the default, because the one A/B on the
// 16-core machine showed no gain at 2 MiB x 16 (+3%, within its spread) and
// a loss at 32 MiB x 16 (benchmarks/README.md, "Session eight: loads, larger
// pieces").
size_t solo_piece_bytes() {
  static const size_t v = [] {
    const char* e = std::getenv("ADP_BOUNCE_PIECE_KB");
    const uint64_t kb = e ? std::strtoull(e, nullptr, 10) : 0;
    if (e && kb && kb % 4 == 0 && kb <= (CardStore::kLargeBouncePieceBytes >> 10)) return size_t(kb) << 10;
    if (e) ADP_WARN("ADP_BOUNCE_PIECE_KB=%s is not a multiple of 4 from 4 to 1024: ignored", e);
    return CardStore::kBouncePieceBytes;
  }();
  return v;
}
// How long the thread that holds the card place waits for the next piece
// (1 MiB, about 0.1 ms to read) before it abandons the place: the longest a
// client whose memory stalls the read holds back other connections'
// acknowledgements (the frontier's order) and an I/O context, once per
// connection per 30 s (ClientHandler::pipeline_retry_: it stores through the buffer alone
// meanwhile), and by at most GatewayShared::max_pipelined_stores at once.
constexpr int kPipelinePieceWaitMs = 200;
// And the longest it holds the place for the whole object (review r8 B2: a
// client that serves each piece just inside the piece's wait would hold it
// for the whole object): kPipelinePieceWaitMs plus the object's bytes at this
// rate (a reader of memory goes at 5-60 GB/s), so 264 ms for 32 MiB, 712 ms
// for 256 MiB; a slower read gives the place up as a stalled one does.
constexpr uint64_t kPipelineMinBytesPerSecond = 512ull << 20;

// One of GatewayShared::max_pipelined_stores, taken for a pipelined store's
// whole branch (review r8 S4), given back on every way out of it.
class PipelineSlot {
 public:
  PipelineSlot(GatewayShared& shared, bool want) : shared_(shared) {
    if (!want) return;
    uint32_t n = shared_.pipelined_stores.load(std::memory_order_relaxed);
    while (n < shared_.max_pipelined_stores &&
           !shared_.pipelined_stores.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel)) {
    }
    taken_ = n < shared_.max_pipelined_stores;
  }
  ~PipelineSlot() { release(); }
  void release() {
    if (taken_) shared_.pipelined_stores.fetch_sub(1, std::memory_order_acq_rel);
    taken_ = false;
  }
  PipelineSlot(const PipelineSlot&) = delete;
  PipelineSlot& operator=(const PipelineSlot&) = delete;
  bool taken() const { return taken_; }

 private:
  GatewayShared& shared_;
  bool taken_ = false;
};

}  // namespace

std::string ClientHandler::peer() const {
  if (tcp_) {
    sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char host[64] = "?";
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
      ::getnameinfo(reinterpret_cast<sockaddr*>(&sa), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
    return std::string("tcp ") + host;
  }
  ucred cred{};
  socklen_t len = sizeof cred;
  ::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len);
  return "unix pid " + std::to_string(cred.pid) + " uid " + std::to_string(cred.uid);
}

// The connection's store reader: one job at a time (a chunk's reads), posted
// by the connection's thread, which waits for it to end before the next.
struct ClientHandler::StoreReader {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> job;
  bool pending = false;  // job posted and not yet ended
  bool quit = false;
  std::thread thread;
};

bool ClientHandler::post_to_reader(std::function<void()> job) {
  if (!reader_) {
    auto r = std::make_shared<StoreReader>();
    try {
      r->thread = std::thread([r = r.get(), id = id_] {
        set_thread_name("adp-gw-sread", static_cast<int>(id));
        t_store_reader = true;
        std::unique_lock<std::mutex> l(r->mu);
        for (;;) {
          r->cv.wait(l, [r] { return r->quit || r->pending; });
          if (!r->pending) return;  // quit, and nothing left to run
          std::function<void()> run = std::move(r->job);
          l.unlock();
          run();
          run = nullptr;
          l.lock();
          r->pending = false;
          r->cv.notify_all();
        }
      });
    } catch (const std::system_error& e) {  // a thread limit (review r8 S3): the buffer path, as before
      ADP_WARN_LIMITED("gateway: client #%llu: no store reader thread (%s): its stores go through the buffer", ull(id_),
                       e.what());
      return false;
    }
    reader_ = std::move(r);
  }
  std::unique_lock<std::mutex> l(reader_->mu);
  reader_->cv.wait(l, [this] { return !reader_->pending; });  // the one before has ended
  reader_->job = std::move(job);
  reader_->pending = true;
  reader_->cv.notify_all();
  return true;
}

Status ClientHandler::ended() const {
  if (abandoned_ || !t_in_card) return Status::Closed("the gateway stopped without this connection");
  if (control_ && control_->stopping.load(std::memory_order_relaxed))
    return Status::Closed("the gateway is stopping: the batch in progress ends here");
  return Status::Ok();
}

template <typename F>
Status ClientHandler::in_client_memory(F&& fn) {
  if (control_) {
    std::lock_guard<std::mutex> l(control_->mu);
    if (control_->abandoned) return Status::Closed("the gateway stopped");
    // No new transfer once stop() began: one the client stalls would hold it.
    if (control_->stopping.load(std::memory_order_relaxed)) return Status::Closed("the gateway is stopping");
    // Since the last transfer began or ended: stop() gives up only when no
    // thread of this connection got through one for that long.
    control_->in_transfer++;
    control_->transfer_since = std::chrono::steady_clock::now();
  }
  // Out of the card gate while the client may stall this thread (the card
  // can close meanwhile); back in only if it is still open.
  const bool in_card = t_in_card;
  card_leave(shared_->gate);
  Status s = fn();
  if (control_) {
    std::lock_guard<std::mutex> l(control_->mu);
    control_->in_transfer--;
    control_->transfer_since = std::chrono::steady_clock::now();
    if (control_->abandoned) {
      abandoned_ = true;
      return Status::Closed("the gateway stopped while the client's memory stalled it");
    }
  }
  if (in_card && !card_enter(shared_->gate)) {
    abandoned_ = true;
    return Status::Closed("the gateway closed its card while the client's memory stalled it");
  }
  return s;
}

void ClientHandler::refuse(const Status& why) {
  // Before the handshake the peer is unknown (and may be one of hundreds):
  // those lines are rate-limited.
  if (handshake_done_)
    ADP_WARN("gateway: client #%llu (%s): %s; closing the connection", ull(id_), peer().c_str(),
             log_safe(why.message()).c_str());
  else
    ADP_WARN_LIMITED("gateway: client #%llu (%s): %s; closing the connection", ull(id_), peer().c_str(),
                     log_safe(why.message()).c_str());
  std::vector<uint8_t> body;
  proto::encode_error(why.message(), &body);
  proto::write_frame(fd_, proto::FrameType::kError, last_request_id_, body, {},
                     Clock::now() + std::chrono::milliseconds(200));
  proto::finish_sending(fd_);
}

Status ClientHandler::reserve_ring(uint64_t bytes) {
  const ConnectionLimits& lim = shared_->limits;
  auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  if (bytes > lim.max_ring_bytes) {
    shared_->refused++;
    return Status::InvalidArgument("a ring of " + mib(bytes) + " is larger than this gateway allows per connection (" +
                                   mib(lim.max_ring_bytes) + ", --max-ring-mb)");
  }
  uint64_t cur = shared_->ring_bytes_mapped.load();
  do {
    if (cur + bytes > lim.max_ring_total_bytes) {
      shared_->refused++;
      return Status::Busy("the gateway's ring memory is used up (" + mib(cur) + " of " + mib(lim.max_ring_total_bytes) +
                          " held by other connections, --max-ring-total-mb); " + "this ring needs " + mib(bytes));
    }
  } while (!shared_->ring_bytes_mapped.compare_exchange_weak(cur, cur + bytes));
  ring_reserved_ = bytes;
  return Status::Ok();
}

Status ClientHandler::handshake() {
  proto::Frame frame;
  const auto timeout = std::chrono::milliseconds(shared_->limits.handshake_timeout_ms);
  Status s = proto::read_frame(fd_, proto::kMaxHelloBodyBytes, Clock::now() + timeout, &frame, tcp_ ? 0 : 1);
  if (s.code() == Status::Code::kTimedOut)
    return Status::InvalidArgument("no hello within the handshake timeout (" + std::to_string(timeout.count()) +
                                   " ms)");
  if (!s.ok()) return s;
  if (frame.header.type != static_cast<uint8_t>(proto::FrameType::kHello)) {
    proto::close_fds(&frame.fds);
    return Status::InvalidArgument("expected a hello frame, got type " + std::to_string(frame.header.type));
  }
  last_request_id_ = frame.header.request_id;
  proto::Hello hello;
  s = proto::decode_hello(frame.body, &hello);
  if (s.ok() && tcp_ && !proto::token_matches(hello.token, shared_->token))
    s = Status::InvalidArgument("authentication failed: wrong or missing token");
  bool want_ring = hello.features & proto::kFeatureRing;
  if (s.ok() && want_ring != (frame.fds.size() == 1))
    s = Status::InvalidArgument(tcp_ ? "a ring cannot be shared over TCP"
                                     : "ring feature and passed descriptor disagree");
  if (s.ok() && tcp_) {
    if (shared_->tcp_clients.fetch_add(1) >= static_cast<uint32_t>(shared_->limits.max_tcp_clients)) {
      shared_->tcp_clients--;
      shared_->refused++;
      s = Status::Busy("too many TCP clients (" + std::to_string(shared_->limits.max_tcp_clients) +
                       ", --max-tcp-clients)");
    } else {
      tcp_counted_ = true;
    }
  }
  if (s.ok() && want_ring) s = reserve_ring(hello.ring_bytes);
  if (!s.ok()) {
    proto::close_fds(&frame.fds);
    return s;
  }
  if (want_ring) {
    s = proto::SharedRing::Attach(frame.fds[0], hello.ring_bytes, &ring_);
    if (!s.ok()) return s;
  }
  proto::HelloOk ok;
  ok.features = ring_ ? proto::kFeatureRing : 0;
  // Segments need the ring (its control page holds the load lease).
  segments_enabled_ = ring_ && (hello.features & proto::kFeatureSegments);
  // Stores read a segment under the lease for a chunk's write and sync:
  // bounded on a memory-speed card only (elsewhere the ring's copy is small
  // next to the card's write).
  segment_stores_ =
      segments_enabled_ && (hello.features & proto::kFeatureSegmentStores) && shared_->store->memory_speed();
  if (segment_stores_) ok.features |= proto::kFeatureSegmentStores;
  // r4: gets from a memory-speed card are published piece by piece (a
  // disk card is read whole into the ring, as before: not measured in pieces).
  ring_progress_ = ring_ && (hello.features & proto::kFeatureRingProgress) && shared_->store->memory_speed();
  if (ring_progress_) {
    ok.features |= proto::kFeatureRingProgress;
    if (const char* d = std::getenv("ADP_TEST_RING_PIECE_DELAY_MS")) test_piece_delay_ms_ = std::atoi(d);
  }
  // r5: process memory, only with the ring (its control page holds the
  // load lease); granted later by a registration that proves access.
  if (ring_) {
    process_offered_ = hello.features & proto::kFeatureProcessMemory;
    ok.features |= process_offered_;
    // r6: ProcessOk then says how large an object a process store may be.
    store_limit_sent_ =
        (process_offered_ & proto::kFeatureProcessStores) && (hello.features & proto::kFeatureStoreLimit);
    if (store_limit_sent_) ok.features |= proto::kFeatureStoreLimit;
  }
  if (segments_enabled_ || process_offered_) {
    if (const char* d = std::getenv("ADP_TEST_SEGMENT_WRITE_DELAY_MS")) test_segment_delay_ms_ = std::atoi(d);
    if (const char* d = std::getenv("ADP_TEST_PROCESS_WRITE_STALL_MS")) test_process_stall_ms_ = std::atoi(d);
    if (const char* on = std::getenv("ADP_TEST_PROCESS_WRITE_STALL_ON"))
      test_process_stall_on_helper_ = std::string_view(on) == "helper";
    if (const char* d = std::getenv("ADP_TEST_PROCESS_READ_STALL_MS")) test_process_read_stall_ms_ = std::atoi(d);
    if (const char* d = std::getenv("ADP_TEST_PROCESS_READ_PIECE_DELAY_MS")) test_process_read_delay_ms_ = std::atoi(d);
    if (const char* d = std::getenv("ADP_TEST_PIPELINE_RETRY_MS"))
      pipeline_retry_ = std::chrono::milliseconds(std::atoi(d));
    if (const char* d = std::getenv("ADP_TEST_LOADER_IDLE_MS")) test_loader_idle_ms_ = std::atoi(d);
  }
  if (segments_enabled_) {
    ok.features |= proto::kFeatureSegments;
  }
  ok.max_object_bytes = shared_->store->max_object_bytes();
  ok.server = shared_->description;
  std::vector<uint8_t> body;
  proto::encode_hello_ok(ok, &body);
  s = proto::write_frame(fd_, proto::FrameType::kHelloOk, frame.header.request_id, body, {},
                         Clock::now() + proto::kFrameTimeout);
  if (s.ok())
    ADP_INFO("gateway: client #%llu connected (%s, %s, %s)", ull(id_), peer().c_str(),
             log_safe(hello.client_name).c_str(),
             ring_ ? ("ring " + std::to_string(ring_->size() >> 20) + " MiB").c_str() : "payload inline");
  return s;
}

void ClientHandler::run() {
  Status s = handshake();
  if (tcp_) shared_->tcp_handshakes--;  // counted by the accept thread
  if (s.ok()) {
    handshake_done_ = true;
    shared_->clients++;
    proto::Frame frame;
    std::vector<uint8_t> table, payload;
    uint32_t max_body = ring_ ? proto::kMaxTableBytes : proto::kMaxFrameBodyBytes;
    const int idle_ms = shared_->limits.idle_timeout_ms;
    while (s.ok()) {
      auto idle_by = idle_ms > 0 ? Clock::now() + std::chrono::milliseconds(idle_ms) : proto::kNoDeadline;
      if (loader_) {  // no longer counted as loading once it waits this long for its next request
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, test_loader_idle_ms_) == 0) loader_.reset();
      }
      if (store_buf_.capacity() || hold_.capacity()) {
        // Neither a store buffer nor a load's hold is kept by a connection that sent nothing for a while.
        int wait_ms = kStoreBufferIdleMs;
        if (idle_ms > 0) wait_ms = std::min(wait_ms, idle_ms);
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, wait_ms) == 0) {
          release_store_buffer();
          settle_hold(true);
        }
      }
      s = proto::read_frame(fd_, max_body, idle_by, &frame, segments_enabled_ ? 1 : 0);
      if (s.code() == Status::Code::kTimedOut) {
        if (Clock::now() >= idle_by) {
          // Closed quietly, as a restart would: the client reconnects on its next batch.
          ADP_INFO("gateway: client #%llu idle for %d s: closing the connection", ull(id_), idle_ms / 1000);
          s = Status::Closed("idle");
          break;
        }
        s = Status::InvalidArgument("frame not completed within " + std::to_string(proto::kFrameTimeout.count()) +
                                    " ms");
      }
      if (!s.ok()) break;
      const auto type = static_cast<proto::FrameType>(frame.header.type);
      if (type == proto::FrameType::kRegisterSegment) {
        s = serve_register_segment(&frame);
        continue;
      }
      if (type == proto::FrameType::kRegisterProcess && frame.fds.empty()) {
        s = serve_register_process(frame);
        continue;
      }
      if (!frame.fds.empty()) {
        proto::close_fds(&frame.fds);
        s = Status::InvalidArgument("a descriptor on a frame that takes none");
        break;
      }
      s = type == proto::FrameType::kStats ? serve_stats(frame) : serve_batch(frame, &table, &payload);
      settle_hold(false);
    }
    shared_->clients--;
  }
  for (auto& seg : segments_)
    if (seg) {
      seg.reset();
      shared_->segments--;
    }
  if (reader_) {  // idle: every job ended before the batch that posted it did
    {
      std::lock_guard<std::mutex> l(reader_->mu);
      reader_->quit = true;
    }
    reader_->cv.notify_all();
    reader_->thread.join();
    reader_.reset();
  }
  if (process_) {
    process_.reset();
    shared_->processes--;
  }
  release_store_buffer();
  settle_hold(true);
  loader_.reset();
  ring_.reset();
  shared_->ring_bytes_mapped -= ring_reserved_;
  if (tcp_counted_) shared_->tcp_clients--;
  if (abandoned_)
    ADP_INFO("gateway: client #%llu: the transfer stop() gave up on ended (%s); its thread ends", ull(id_),
             log_safe(s.message()).c_str());
  else if (s.code() == Status::Code::kClosed)
    ADP_INFO("gateway: client #%llu gone after %llu batches", ull(id_), ull(served_));
  else
    refuse(s);
}

Status ClientHandler::serve_batch(const proto::Frame& frame, std::vector<uint8_t>* table,
                                  std::vector<uint8_t>* payload) {
  if (frame.header.type != static_cast<uint8_t>(proto::FrameType::kBatch))
    return Status::InvalidArgument("unexpected frame type " + std::to_string(frame.header.type) +
                                   " after the handshake");
  Status s = check_request_id(frame);
  if (!s.ok()) return s;
  proto::BatchRequest req;
  s = proto::decode_batch(frame.body, &req, process_granted_);
  if (!s.ok()) return s;
  if (ring_ && !req.payload.empty()) return Status::InvalidArgument("inline payload on a ring connection");
  if (req.timeout_ms > shared_->limits.max_request_timeout_ms) {
    ADP_WARN_LIMITED("gateway: client #%llu sent a deadline of %u ms: held to %u ms (--max-request-timeout-s)",
                     ull(id_), req.timeout_ms, shared_->limits.max_request_timeout_ms);
    req.timeout_ms = shared_->limits.max_request_timeout_ms;
  }

  proto::BatchReply reply;
  reply.results.resize(req.items.size());
  payload->clear();
  uint64_t in_ring = 0;  // occupancy, for status and metrics
  if (ring_)
    for (const auto& it : req.items) in_ring += it.segment ? 0 : it.size;
  shared_->ring_bytes_in_use += in_ring;
  s = run_batch(req, frame.header.request_id, &reply, payload);
  shared_->ring_bytes_in_use -= in_ring;
  if (!s.ok()) return s;
  table->clear();
  proto::encode_batch_reply(reply, table);
  iovec iv{payload->data(), payload->size()};
  served_++;
  shared_->batches.fetch_add(1, std::memory_order_relaxed);
  s = proto::write_frame(fd_, proto::FrameType::kBatchReply, frame.header.request_id, *table,
                         {&iv, payload->empty() ? 0u : 1u}, Clock::now() + proto::kFrameTimeout);
  // A client asleep on the ticket then finds the reply on the socket.
  if (ring_progress_ && req.op == proto::Op::kGet) bump_ticket();
  return s;
}

Status ClientHandler::check_request_id(const proto::Frame& frame) {
  if (frame.header.request_id <= last_request_id_)
    return Status::InvalidArgument("request id " + std::to_string(frame.header.request_id) + " out of order (last " +
                                   std::to_string(last_request_id_) + ")");
  last_request_id_ = frame.header.request_id;
  return Status::Ok();
}

Status ClientHandler::serve_register_segment(proto::Frame* frame) {
  // The descriptor is ours from here on: closed on every path.
  std::vector<int> fds = std::move(frame->fds);
  frame->fds.clear();
  proto::RegisterSegment reg;
  Status s = segments_enabled_ ? check_request_id(*frame)
                               : Status::InvalidArgument("segment registration without the segments feature");
  if (s.ok()) s = proto::decode_register_segment(frame->body, &reg);
  if (s.ok() && fds.size() != 1) s = Status::InvalidArgument("segment registration without its descriptor");
  if (s.ok() && segments_[reg.id - 1])
    s = Status::InvalidArgument("segment " + std::to_string(reg.id) + " registered twice");
  if (!s.ok()) {
    proto::close_fds(&fds);
    return s;
  }
  s = proto::ClientSegment::Attach(fds[0], reg.bytes, &segments_[reg.id - 1]);
  if (!s.ok()) return s;
  shared_->segments++;
  ADP_DEBUG("gateway: client #%llu registered segment %u (%llu MiB)", ull(id_), reg.id, ull(reg.bytes >> 20));
  return proto::write_frame(fd_, proto::FrameType::kSegmentOk, frame->header.request_id, {}, {},
                            Clock::now() + proto::kFrameTimeout);
}

Status ClientHandler::serve_register_process(const proto::Frame& frame) {
  Status s = check_request_id(frame);
  if (!s.ok()) return s;
  if (!process_offered_) return Status::InvalidArgument("process registration without a process-memory feature");
  if (process_registered_) return Status::InvalidArgument("process registered twice");
  process_registered_ = true;
  proto::RegisterProcess reg;
  s = proto::decode_register_process(frame.body, &reg);
  if (!s.ok()) return s;
  // A refusal is an answer, not a protocol error: the client keeps the ring.
  // (The probe's read is a transfer a client can stall, as any other.)
  s = in_client_memory(
      [&] { return proto::ProcessMemory::Attach(fd_, reg.pid, reg.probe_addr, reg.probe, &process_); });
  if (abandoned_) return s;
  proto::ProcessOk ok;
  ok.with_store_limit = store_limit_sent_;
  ok.max_store_object_bytes = store_object_limit();
  if (s.ok()) {
    ok.features = process_offered_;
    process_granted_ = process_offered_;
    shared_->processes++;
    ADP_DEBUG("gateway: client #%llu granted process memory (pid %d)", ull(id_), process_->pid());
  } else {
    ok.reason = s.message();
    shared_->process_refusals++;
    ADP_INFO("gateway: client #%llu (%s): process memory refused, the ring stays: %s", ull(id_), peer().c_str(),
             log_safe(s.message()).c_str());
  }
  std::vector<uint8_t> body;
  proto::encode_process_ok(ok, &body);
  return proto::write_frame(fd_, proto::FrameType::kProcessOk, frame.header.request_id, body, {},
                            Clock::now() + proto::kFrameTimeout);
}

Status ClientHandler::load_into_process(const proto::BatchItem& it, uint64_t request_id, proto::Deadline deadline,
                                        bool* revoked) {
  namespace prof = load_profile;
  prof::Timer whole(prof::kObject);
  if (*revoked) return Status::TimedOut("the client gave up the load (lease revoked)");
  if (test_segment_delay_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(test_segment_delay_ms_));
  // The pid names this client only while it lives (docs/protocol.md, "Process memory": the pid reuse window):
  // checked before the object and before each of its pieces.
  if (!process_->alive()) return Status::Closed("the client process is gone");
  PiecePool* pool = shared_->pieces.get();
  if (!bounces_) {  // one bounce buffer for this thread and one for each helper an object may take
    bounce_slots_ = 1 + (pool ? pool->max_helpers() : 0);
    bounces_ = std::make_unique<AlignedBuffer[]>(bounce_slots_);
  }
  // The sink runs on this thread and on the pool's helpers at once, each
  // piece's write under the shared lease (join_lease).
  std::mutex failed_mu;
  Status failed;  // the first write that failed: the client gone, an address it does not have
  std::atomic<bool> gave_up{false};
  // The first failure, but Closed (the client gone, or the gateway stopped
  // without this connection) wins over any: it ends the request, and the
  // connection, before anything more of the server is touched (review r7 B1).
  auto fail = [&](Status s) {
    std::lock_guard<std::mutex> lock(failed_mu);
    if (failed.ok() || (s.code() == Status::Code::kClosed && failed.code() != Status::Code::kClosed))
      failed = std::move(s);
    return false;
  };
  auto sink_write = [&](size_t done, const uint8_t* src, size_t len) {
    // The request's deadline before each piece, not only each item (S1).
    if (Clock::now() >= deadline)
      return fail(Status::TimedOut("deadline passed in the gateway while the pieces went out"));
    bool alive;
    {
      prof::Timer t(prof::kAlive);
      alive = process_->alive();
    }
    if (!alive) return fail(Status::Closed("the client process is gone"));
    if (test_process_stall_ms_ && done > 0 && (!test_process_stall_on_helper_ || PiecePool::on_helper_thread()) &&
        !g_process_stall_taken.exchange(true)) {
      // Counted as a transfer of the client's memory (stop() may leave it behind), outside the lease.
      Status s = in_client_memory([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(test_process_stall_ms_));
        return Status::Ok();
      });
      if (!s.ok()) return fail(std::move(s));
    }
    bool joined;
    {
      prof::Timer t(prof::kLease);
      joined = join_lease(request_id, deadline);
    }
    if (!joined) {
      if (Clock::now() >= deadline)
        return fail(Status::TimedOut("deadline passed in the gateway while the pieces went out"));
      gave_up = true;
      return false;
    }
    Status w = in_client_memory([&] {
      prof::Timer t(prof::kWrite);
      return process_->write(it.offset + done, src, len);
    });
    {
      prof::Timer t(prof::kLease);
      leave_lease(request_id);
    }
    return w.ok() || fail(std::move(w));
  };
  // Out of the card gate for the whole write: the lease may wait on writers
  // the client stalls. Back in only while the gate is open.
  auto sink = [&](size_t done, const uint8_t* src, size_t len) {
    prof::Timer t(prof::kSink);
    const bool in_card = t_in_card;
    card_leave(shared_->gate);
    const bool ok = sink_write(done, src, len);
    if (in_card && !card_enter(shared_->gate))
      return fail(Status::Closed("the gateway closed its card while this load's pieces went out"));
    return ok;
  };
  auto accept = [&](size_t size) {
    if (size == it.size) return true;
    ADP_WARN_LIMITED("object %s holds %zu bytes but the load buffer has %llu: served as a miss",
                     log_safe(it.key).c_str(), size, ull(it.size));
    return false;
  };
  // An IoContext only for a read from a card that is not memory-speed (or
  // a damaged object's tombstone), given back before any piece goes out.
  // The object then stays in hold_: its bytes are reserved first, within
  // --max-store-buffer-total-mb for the holds of all connections together.
  // A memory-speed card never reads into hold_ (its context is only for a
  // tombstone), so nothing is reserved there: else a total below an
  // object's size would answer Busy forever and never drop it (review r8).
  Status hold_refused;
  const bool into_hold = !shared_->store->memory_speed();
  auto with_ctx = [&](const std::function<void(IoContext&)>& fn) {
    if (into_hold) hold_refused = reserve_hold(kBlockSize + it.size);
    if (!hold_refused.ok()) return false;
    auto lease = shared_->pool->acquire(deadline);
    if (lease) fn(**lease);  // the read, and the swap into hold_
    count_hold();
    return bool(lease);
  };
  // Each piece, on this thread or a helper, runs inside the card gate (a
  // helper freed after stop() may pick up this job: it finds the gate
  // closed and runs nothing). This thread is out of it while it waits for
  // the pieces (a helper's may stall), and a false return once the gate
  // closed meanwhile tells get_via_bounce to touch the store no more.
  CardGate& gate = shared_->gate;
  auto gated = [&gate](const PiecePool::PieceFn& piece) {
    return [&gate, &piece](size_t i, int slot) {
      load_profile::Timer t(load_profile::kPiece);
      CardSection in(gate);
      return in && piece(i, slot);
    };
  };
  // The piece size is fixed here, at the object's start: with other pieces
  // than 256 KiB (ADP_BOUNCE_PIECE_KB) no helper joins it (run alone), so one
  // writer holds the lease at a time and a revoke waits for at most one such
  // piece (docs/protocol.md).
  const size_t solo = solo_piece_bytes();
  const bool alone = solo != CardStore::kBouncePieceBytes && !(pool && pool->helpers_now());
  const size_t piece_bytes = alone ? solo : CardStore::kBouncePieceBytes;
  CardStore::RunPiecesFn run_pieces = [&](size_t n, const PiecePool::PieceFn& piece) {
    const PiecePool::PieceFn each = gated(piece);
    card_leave(gate);
    bool ok = true;
    if (pool)
      ok = pool->run(n, each, alone);
    else
      for (size_t i = 0; i < n && ok; i++) ok = each(i, 0);
    if (!card_enter(gate)) return fail(Status::Closed("the gateway closed its card while this load's pieces went out"));
    return ok;
  };
  if (!card_enter(gate)) return Status::Closed("the gateway is closing its card");
  Status st = shared_->store->get_via_bounce(it.key, accept, with_ctx, {bounces_.get(), bounce_slots_}, &hold_, sink,
                                             run_pieces, piece_bytes);
  if (gave_up) *revoked = true;
  if (Status e = ended(); !e.ok()) return e;
  if (!hold_refused.ok()) return hold_refused;
  if (!failed.ok()) return failed;
  if (*revoked) return Status::TimedOut("the client gave up the load (lease revoked)");
  if (st.ok()) shared_->process_loads.fetch_add(1, std::memory_order_relaxed);
  return st;
}

bool ClientHandler::join_lease(uint64_t request_id, proto::Deadline deadline) {
  std::unique_lock<std::mutex> lock(lease_mu_);
  // Writes join a held lease until each slot has written once; then the
  // next waits for the lease to go back to OPEN. A waiter re-takes it at
  // once, so a revoke for any reason but the deadline may lose that race
  // for the rest of the object (review r7 S4); past the request's deadline
  // nothing takes or joins it, so a revoke at the client's deadline waits
  // out at most the pieces already in flight, one per slot.
  lease_free_.wait(lock, [&] { return lease_holders_ == 0 || lease_joins_ < bounce_slots_; });
  if (Clock::now() >= deadline) return false;
  if (lease_holders_ == 0) {
    if (!take_lease(request_id)) return false;
    lease_joins_ = 0;
  }
  lease_holders_++;
  lease_joins_++;
  return true;
}

void ClientHandler::leave_lease(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(lease_mu_);
  if (--lease_holders_ == 0) {
    give_lease(request_id);
    lease_free_.notify_all();
  }
}

uint64_t ClientHandler::store_object_limit() const {
  const ConnectionLimits& lim = shared_->limits;
  return std::min(lim.max_store_buffer_bytes, lim.max_store_buffer_total_bytes) & ~uint64_t(4095);
}

void ClientHandler::release_store_buffer() {
  const uint64_t held = store_buf_.capacity();
  if (!held) return;
  {
    AlignedBuffer gone;
    store_buf_.swap(gone);
  }  // unmapped here
  shared_->store_buffer_bytes.fetch_sub(held);
  std::lock_guard<std::mutex> l(shared_->store_buffer_mu);
  shared_->store_buffer_freed.notify_all();
}

void ClientHandler::settle_hold(bool release) {
  if (release || hold_over_ || hold_.capacity() > store_object_limit()) {
    AlignedBuffer gone;
    hold_.swap(gone);
  }  // unmapped here
  hold_over_ = false;
  count_hold();
}

Status ClientHandler::reserve_hold(uint64_t bytes) {
  bytes = (bytes + 4095) & ~uint64_t(4095);
  if (bytes <= hold_counted_) return Status::Ok();
  const uint64_t total = shared_->limits.max_store_buffer_total_bytes;
  const uint64_t more = bytes - hold_counted_;
  uint64_t cur = shared_->load_hold_bytes.load();
  do {
    if (cur + more > total) {
      shared_->load_hold_busy.fetch_add(1, std::memory_order_relaxed);
      auto mib = [](uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; };
      return Status::Busy("the gateway's load buffers are used up (" + mib(cur) + " of " + mib(total) +
                          " held by connections' last loads from a card that is not memory-speed, "
                          "--max-store-buffer-total-mb); this load needs " +
                          mib(more) + " more");
    }
  } while (!shared_->load_hold_bytes.compare_exchange_weak(cur, cur + more));
  hold_counted_ = bytes;
  return Status::Ok();
}

void ClientHandler::count_hold() {
  // What is mapped is what counts: a context's staging may be larger than
  // the bytes reserved. Past the total (or a store buffer's size), it is
  // given back after the batch.
  const uint64_t now = hold_.capacity();
  uint64_t sum = shared_->load_hold_bytes.load();
  if (now > hold_counted_) sum = shared_->load_hold_bytes.fetch_add(now - hold_counted_) + (now - hold_counted_);
  if (now < hold_counted_) sum = shared_->load_hold_bytes.fetch_sub(hold_counted_ - now) - (hold_counted_ - now);
  hold_counted_ = now;
  // Only a connection that holds something gives it back (review r8: a
  // release of its own re-armed the flag, dropping its next hold).
  if (now > 0 && (sum > shared_->limits.max_store_buffer_total_bytes || now > store_object_limit())) hold_over_ = true;
}

Status ClientHandler::grow_store_buffer(uint64_t need, proto::Deadline deadline) {
  const uint64_t total = shared_->limits.max_store_buffer_total_bytes;
  // Exactly the chunk's size in whole MiB, never past the limit (no doubling).
  const uint64_t bytes =
      std::max(need, std::min((need + (1u << 20) - 1) & ~uint64_t((1u << 20) - 1), store_object_limit()));
  release_store_buffer();  // its contents need not survive, and its bytes count for the new one
  auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  uint64_t cur = shared_->store_buffer_bytes.load();
  for (;;) {
    if (cur + bytes <= total) {
      if (shared_->store_buffer_bytes.compare_exchange_weak(cur, cur + bytes)) break;
      continue;
    }
    // Waits for room while the client still waits (its deadline) and the
    // connection is not closing (the client gone, or the gateway stopping).
    pollfd p{fd_, POLLRDHUP, 0};
    const auto now = Clock::now();
    if (now >= deadline || (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))) {
      shared_->store_buffer_busy.fetch_add(1, std::memory_order_relaxed);
      return Status::Busy("the gateway's store buffers are used up (" + mib(cur) + " of " + mib(total) +
                          " held by other connections, --max-store-buffer-total-mb); this chunk needs " + mib(bytes));
    }
    {
      std::unique_lock<std::mutex> l(shared_->store_buffer_mu);
      shared_->store_buffer_waiters++;
      shared_->store_buffer_freed.wait_for(l, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(20)));
      shared_->store_buffer_waiters--;
    }
    cur = shared_->store_buffer_bytes.load();
  }
  if (!store_buf_.reserve_exact(bytes)) {
    shared_->store_buffer_bytes.fetch_sub(bytes);
    std::lock_guard<std::mutex> l(shared_->store_buffer_mu);
    shared_->store_buffer_freed.notify_all();
    return Status::IoError("out of memory for the store buffer of " + mib(bytes));
  }
  // What is mapped is what counts (release_store_buffer gives back the capacity).
  if (store_buf_.capacity() > bytes) shared_->store_buffer_bytes.fetch_add(store_buf_.capacity() - bytes);
  return Status::Ok();
}

bool ClientHandler::read_process_chunk(const proto::BatchRequest& req, size_t i, size_t end, proto::Deadline deadline,
                                       ProcessRead* pr, std::vector<PutItem>* items, std::vector<Status>* st,
                                       const std::function<void(size_t, size_t)>* on_piece) {
  const uint64_t cap = store_object_limit();
  uint64_t need = 0;
  for (size_t k = i; k < end; k++)
    if (req.items[k].segment == proto::kProcessSegment && req.items[k].size <= cap)
      need += (req.items[k].size + 4095) & ~uint64_t(4095);  // each object 4 KiB aligned (O_DIRECT from it)
  if (need > store_buf_.capacity()) {
    Status s = grow_store_buffer(need, deadline);
    if (!s.ok()) {
      for (size_t k = i; k < end; k++)
        if (req.items[k].segment == proto::kProcessSegment) (*st)[k] = s;
      return true;
    }
  }
  // The chunk's objects laid out in the buffer (4 KiB aligned), then read in
  // pieces of kProcessReadPieceBytes on this thread and on helpers of the
  // piece pool at once, each piece under the shared lease, the client's
  // liveness and the deadline checked before each. A helper stalled in a
  // piece holds back this connection only (PiecePool: no job waits for a
  // helper to come free), and nothing shared is held while it reads.
  struct Piece {
    size_t obj;  // index in objs
    size_t off, len;
  };
  struct Obj {
    size_t k;
    uint8_t* dst;
    Status st;  // the first piece that failed (under mu)
  };
  std::vector<Obj> objs;
  std::vector<Piece> pieces;
  uint64_t at = 0;
  for (size_t k = i; k < end; k++) {
    const proto::BatchItem& it = req.items[k];
    if (it.segment != proto::kProcessSegment) continue;
    if (it.size > cap) {
      const ConnectionLimits& lim = shared_->limits;
      const char* option = lim.max_store_buffer_total_bytes < lim.max_store_buffer_bytes ? "--max-store-buffer-total-mb"
                                                                                         : "--max-store-buffer-mb";
      ADP_WARN_LIMITED(
          "gateway: client #%llu: an object of %llu bytes is larger than the store buffer (%llu MiB, %s): refused",
          ull(id_), ull(it.size), ull(cap >> 20), option);
      (*st)[k] = Status::InvalidArgument("an object of " + std::to_string(it.size) +
                                         " bytes is larger than the gateway's store buffer for process memory (" +
                                         std::to_string(cap >> 20) + " MiB, " + option + ")");
      continue;
    }
    if (Clock::now() >= deadline) {
      (*st)[k] = Status::TimedOut("deadline passed in the gateway: not written");
      continue;
    }
    objs.push_back({k, store_buf_.data() + at, Status::Ok()});
    for (size_t off = 0; off < it.size; off += kProcessReadPieceBytes)
      pieces.push_back({objs.size() - 1, off, std::min<size_t>(it.size - off, kProcessReadPieceBytes)});
    at += (it.size + 4095) & ~uint64_t(4095);
  }
  if (pieces.empty()) return true;
  PiecePool* pool = shared_->pieces.get();
  if (!bounce_slots_) bounce_slots_ = 1 + (pool ? pool->max_helpers() : 0);  // join_lease's bound
  std::mutex mu;
  bool revoked = false;
  Status gone;
  auto piece = [&](size_t p, int) {
    const Piece& pc = pieces[p];
    Obj& o = objs[pc.obj];
    const proto::BatchItem& it = req.items[o.k];
    {
      std::lock_guard<std::mutex> l(mu);
      if (revoked || !gone.ok()) return false;
      if (!o.st.ok()) return true;  // its object failed: the rest of it is not read
    }
    auto fail = [&](Status s) {
      std::lock_guard<std::mutex> l(mu);
      if (o.st.ok()) o.st = std::move(s);
      return true;
    };
    // Tests: slow before each object, outside the lease.
    if (pc.off == 0 && test_segment_delay_ms_)
      std::this_thread::sleep_for(std::chrono::milliseconds(test_segment_delay_ms_));
    if (Clock::now() >= deadline) return fail(Status::TimedOut("deadline passed in the gateway: not written"));
    // The pid names this client only while it lives (docs/protocol.md, "Process memory": the pid reuse window):
    // checked before each piece.
    if (!process_->alive()) {
      std::lock_guard<std::mutex> l(mu);
      gone = Status::Closed("the client process is gone");
      return false;
    }
    if (!join_lease(pr->request_id, deadline)) {
      if (Clock::now() >= deadline) return fail(Status::TimedOut("deadline passed in the gateway: not written"));
      std::lock_guard<std::mutex> l(mu);
      revoked = true;
      return false;
    }
    Status s = in_client_memory([&] {
      if (test_process_read_stall_ms_ && pc.off > 0 &&
          (!test_process_stall_on_helper_ || PiecePool::on_helper_thread()) &&
          !g_process_read_stall_taken.exchange(true))
        std::this_thread::sleep_for(std::chrono::milliseconds(test_process_read_stall_ms_));
      if (test_process_read_delay_ms_ && t_store_reader)
        std::this_thread::sleep_for(std::chrono::milliseconds(test_process_read_delay_ms_));
      return process_->read(it.offset + pc.off, o.dst + pc.off, pc.len);
    });
    leave_lease(pr->request_id);
    if (s.code() == Status::Code::kClosed) {
      std::lock_guard<std::mutex> l(mu);
      gone = std::move(s);
      return false;
    }
    if (!s.ok()) return fail(std::move(s));
    shared_->process_read_bytes.fetch_add(pc.len, std::memory_order_relaxed);
    if (on_piece) (*on_piece)(pc.off, pc.len);
    return true;
  };
  // Out of the card gate for the reads (they touch no card): this thread
  // may wait on helpers, or on the lease, that the client stalls. Back in
  // only while the gate is open.
  const bool in_card = t_in_card;
  card_leave(shared_->gate);
  if (pool) {
    pool->run(pieces.size(), piece);
  } else {
    for (size_t p = 0; p < pieces.size(); p++)
      if (!piece(p, 0)) break;
  }
  if (in_card && !card_enter(shared_->gate)) {
    abandoned_ = true;
    gone = Status::Closed("the gateway closed its card while this store's pieces were read");
  }
  if (!gone.ok()) pr->gone = gone;
  if (revoked) pr->revoked = true;
  if (!pr->gone.ok() || pr->revoked) return false;
  for (Obj& o : objs) {
    if (o.st.ok())
      (*items)[o.k].data = o.dst;
    else
      (*st)[o.k] = std::move(o.st);
  }
  return true;
}

bool ClientHandler::take_lease(uint64_t request_id) {
  uint64_t* word = reinterpret_cast<uint64_t*>(ring_->data());
  uint64_t expected = proto::lease_word(request_id, proto::kLeaseOpen);
  return __atomic_compare_exchange_n(word, &expected, proto::lease_word(request_id, proto::kLeaseWriting), false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

void ClientHandler::give_lease(uint64_t request_id) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(ring_->data()), proto::lease_word(request_id, proto::kLeaseOpen),
                   __ATOMIC_RELEASE);
}

void ClientHandler::publish_progress(size_t item, size_t upto) {
  if (item >= proto::kProgressSlots) return;  // delivered after the reply
  auto* slot = reinterpret_cast<uint32_t*>(ring_->data() + proto::kProgressSlotsAt) + item;
  __atomic_store_n(slot, static_cast<uint32_t>(upto), __ATOMIC_RELEASE);
  bump_ticket();
}

void ClientHandler::bump_ticket() {
  // Sequentially consistent against the client's "waiting, then re-read the
  // ticket": either it sees the new ticket or this sees it waiting.
  auto* ticket = reinterpret_cast<uint32_t*>(ring_->data() + proto::kProgressTicketAt);
  __atomic_fetch_add(ticket, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(reinterpret_cast<uint32_t*>(ring_->data() + proto::kProgressWaitingAt), __ATOMIC_SEQ_CST))
    ::syscall(SYS_futex, ticket, FUTEX_WAKE, 1, nullptr, nullptr, 0);  // shared memory: not FUTEX_PRIVATE
}

Status ClientHandler::serve_stats(const proto::Frame& frame) {
  Status s = check_request_id(frame);
  if (!s.ok()) return s;
  if (!frame.body.empty()) return Status::InvalidArgument("stats request with a body");
  CardSection in_card(shared_->gate);
  if (!in_card) return Status::Closed("the gateway is closing its card");
  std::string json = stats_json(shared_->store->stats(), *shared_);
  std::vector<uint8_t> body(json.begin(), json.end());
  return proto::write_frame(fd_, proto::FrameType::kStatsReply, frame.header.request_id, body, {},
                            Clock::now() + proto::kFrameTimeout);
}

std::string stats_json(const StoreStats& st, const GatewayShared& shared) {
  std::string out = "{";
  auto field = [&out](const char* k, auto v) {
    char buf[96];
    if constexpr (std::is_same_v<decltype(v), bool>)
      std::snprintf(buf, sizeof buf, "\"%s\":%s,", k, v ? "true" : "false");
    else
      std::snprintf(buf, sizeof buf, "\"%s\":%.17g,", k, static_cast<double>(v));
    out += buf;
  };
  StoreStats with = st;
  with.process_loads = shared.process_loads.load();  // the card's own counts are 0
  with.process_stores = shared.process_stores.load();
  for_each_stat(with, field);
  field("clients", shared.clients.load());
  field("batches", shared.batches.load());
  field("ring_bytes", shared.ring_bytes_mapped.load());
  field("ring_used_bytes", shared.ring_bytes_in_use.load());
  field("refused_connections", shared.refused.load());
  field("segments", shared.segments.load());
  field("segment_loads", shared.segment_loads.load());
  field("segment_stores", shared.segment_stores.load());
  field("ring_piece_loads", shared.ring_piece_loads.load());
  field("process_read_bytes", shared.process_read_bytes.load());
  field("process_store_read_ns", shared.process_store_read_ns.load());
  field("process_store_put_ns", shared.process_store_put_ns.load());
  field("process_store_pipelined", shared.process_store_pipelined.load());
  field("process_store_stalls", shared.process_store_stalls.load());
  field("process_store_unpipelined_busy", shared.process_store_unpipelined_busy.load());
  field("store_buffer_bytes", shared.store_buffer_bytes.load());
  field("store_buffer_busy", shared.store_buffer_busy.load());
  field("load_hold_bytes", shared.load_hold_bytes.load());
  field("load_hold_busy", shared.load_hold_busy.load());
  field("store_buffer_waiting", shared.store_buffer_waiters.load());
  field("processes", shared.processes.load());
  field("process_refusals", shared.process_refusals.load());
  field("process_write_threads", shared.pieces ? shared.pieces->threads() : 0);
  field("process_helper_pieces", shared.pieces ? shared.pieces->helped_pieces() : 0);
  field("process_piece_callers", shared.pieces ? shared.pieces->callers() : 0);
  if (load_profile::kEnabled) {  // ADP_LOAD_PROFILE=1 (benchmarks only)
    uint64_t ns[load_profile::kSteps], n[load_profile::kSteps];
    load_profile::totals(ns, n);
    for (int i = 0; i < load_profile::kSteps; i++) {
      const std::string k = std::string("load_profile_") + load_profile::kNames[i];
      field((k + "_ns").c_str(), ns[i]);
      field((k + "_n").c_str(), n[i]);
    }
  }
  out.back() = '}';
  return out;
}

Status ClientHandler::payload_area(const proto::BatchRequest& req, uint8_t** base, uint64_t* size) const {
  *base = nullptr;
  *size = 0;
  for (const auto& it : req.items) {             // decode_batch allows segments on gets and puts only
    if (it.segment == proto::kProcessSegment) {  // decode_batch checked the grant
      if (it.offset + it.size < it.offset)
        return Status::InvalidArgument("item at address " + std::to_string(it.offset) + " of " +
                                       std::to_string(it.size) + " bytes wraps around");
      continue;
    }
    if (it.segment && !segments_[it.segment - 1])
      return Status::InvalidArgument("item names segment " + std::to_string(it.segment) + ", not registered");
    if (it.segment && req.op == proto::Op::kPut && !segment_stores_)
      return Status::InvalidArgument("a store from a segment without the segment-stores feature");
  }
  if (req.op != proto::Op::kPut && req.op != proto::Op::kGet) return Status::Ok();
  if (ring_) {
    *base = ring_->data();
    *size = ring_->size();
  } else if (req.op == proto::Op::kPut) {
    *base = const_cast<uint8_t*>(req.payload.data());
    *size = req.payload.size();
  } else {
    // Inline get: the hits travel back in the reply, which must stay bounded.
    uint64_t total = 0;
    for (const auto& it : req.items) total += it.size;
    if (total > proto::kMaxInlinePayloadBytes)
      return Status::InvalidArgument("get asks for more than one frame's payload");
    return Status::Ok();
  }
  for (const auto& it : req.items) {
    if (it.segment == proto::kProcessSegment) continue;  // the client's own address space: the kernel checks it
    if (it.segment) {
      const auto& seg = segments_[it.segment - 1];
      if (!seg->contains(it.offset, it.size))
        return Status::InvalidArgument("item at offset " + std::to_string(it.offset) + " of " +
                                       std::to_string(it.size) + " bytes lies outside segment " +
                                       std::to_string(it.segment));
    } else if (!fits(it.offset, it.size, *size)) {
      return Status::InvalidArgument("item at offset " + std::to_string(it.offset) + " of " + std::to_string(it.size) +
                                     " bytes lies outside the " + (ring_ ? "ring" : "payload"));
    }
  }
  return Status::Ok();
}

Status ClientHandler::run_batch(const proto::BatchRequest& req, uint64_t request_id, proto::BatchReply* reply,
                                std::vector<uint8_t>* payload) {
  uint8_t* base;
  uint64_t area;
  Status s = payload_area(req, &base, &area);
  if (!s.ok()) return s;
  const size_t n = req.items.size();
  // The client's remaining budget, counted from arrival: work that ends past
  // it is not indexed (put) or not done (get), as the client has given up.
  const auto deadline = Clock::now() + std::chrono::milliseconds(req.timeout_ms);
  std::vector<Status> st(n);
  // A get whose items all lie in the client's process memory takes no
  // IoContext for the batch (load_into_process leases one only to read a
  // disk card, never while it writes into the client); in a mixed get the
  // batch's context is given back before a process item and taken again
  // for the next other item.
  // A put with items in process memory takes its context per chunk, after
  // the chunk's process items were read (read_process_chunk).
  bool all_process = req.op == proto::Op::kGet, put_process = false;
  for (const auto& it : req.items) {
    all_process &= it.segment == proto::kProcessSegment;
    put_process |= req.op == proto::Op::kPut && it.segment == proto::kProcessSegment;
  }
  const bool no_ctx = req.op == proto::Op::kExists || all_process || put_process;
  // Inside the card gate for the batch (the I/O context's lease below ends
  // before it is left), out of it only while the client may stall it.
  CardSection in_card(shared_->gate);
  if (!in_card) return Status::Closed("the gateway is closing its card");
  auto lease = no_ctx ? nullptr : shared_->pool->acquire(deadline);
  if (!lease && !no_ctx) {
    for (size_t i = 0; i < n; i++) st[i] = Status::TimedOut("no I/O context came free before the deadline");
  } else {
    CardStore& store = *shared_->store;
    switch (req.op) {
      case proto::Op::kPut: {
        // In chunks (one sync each on a durable card), the deadline checked
        // before each: once it passed, the items left are not written at
        // all, and nothing is indexed past it.
        // Items in a client's segments (r3) are read in place, each chunk
        // under the load lease: a chunk read after the client gave up is
        // never written, and one whose source shrank is never indexed.
        // Items in the client's process memory (r5) are first read whole
        // with process_vm_readv into this connection's store buffer, each
        // piece under the lease, holding nothing shared (no I/O context, no
        // card space: a read the client stalls holds back this connection
        // only); then the chunk is stored from there as from any memory.
        std::vector<PutItem> items(n);
        bool in_segments = false;
        ProcessRead pr{request_id, deadline};
        // A connection with process stores shares the piece helpers as loads do.
        // (Once: a connection counted as loading is not counted again.)
        PiecePool::Caller caller(put_process && !loader_ ? shared_->pieces.get() : nullptr);
        for (size_t i = 0; i < n; i++) {
          const proto::BatchItem& it = req.items[i];
          if (it.segment == proto::kProcessSegment) {
            items[i] = {it.key, nullptr, it.size};  // data: in store_buf_ once read
            continue;
          }
          in_segments |= it.segment != 0;
          uint8_t* src = it.segment ? segments_[it.segment - 1]->data() : base;
          items[i] = {it.key, src + it.offset, it.size};
        }
        auto intact = [&] {
          for (const auto& seg : segments_)
            if (seg && seg->broken()) return false;
          return true;
        };
        std::vector<PutItem> todo;
        std::vector<size_t> todo_at;
        std::vector<Status> todo_st;
        for (size_t i = 0; i < n;) {
          if (Status e = ended(); !e.ok()) return e;
          if (Clock::now() >= deadline) {
            if (st[i].ok()) st[i] = Status::TimedOut("deadline passed in the gateway: not written");
            i++;
            continue;
          }
          // A chunk with process items fits the store buffer (each object 4 KiB
          // aligned in it), or is one object (refused if larger).
          const uint64_t chunk_bytes =
              put_process ? std::min<uint64_t>(kPutChunkBytes, store_object_limit()) : kPutChunkBytes;
          auto room = [&](size_t k) { return put_process ? (items[k].size + 4095) & ~uint64_t(4095) : items[k].size; };
          size_t end = i + 1;
          for (uint64_t bytes = room(i); end < n && end - i < kPutChunkItems; end++) {
            bytes += room(end);
            if (bytes > chunk_bytes) break;
          }
          // Session eight: one large object on a memory-speed card is read by
          // this connection's store reader while this thread, holding its card
          // place, copies each piece in as soon as it is read (from the cache).
          // The place is reserved once the first piece is read, and held only
          // while pieces keep coming: one not read within kPipelinePieceWaitMs,
          // or the object not read by then plus its bytes at
          // kPipelineMinBytesPerSecond, abandons it (a pad record: the frontier
          // moves on, the I/O context goes back), and the object is stored from
          // the buffer once the reader has it whole, holding nothing shared
          // while it waits, as below.
          // Only while the connections storing and loading leave a CPU for the
          // reader beside each (PiecePool::spare_cpu(), the helpers' rule; with
          // no pool, always): on full CPUs the second thread cost 32 MiB x 16
          // 0.82x -> 0.74x (benchmarks/README.md, "Session eight: stores").
          bool read_before = false;  // the chunk is in store_buf_ already (a pipelined store that stalled)
          const proto::BatchItem& first = req.items[i];
          if (reader_stalled_ && Clock::now() - reader_stalled_at_ >= pipeline_retry_) reader_stalled_ = false;
          bool pipeline = put_process && end == i + 1 && first.segment == proto::kProcessSegment && !reader_stalled_ &&
                          pipeline_min_bytes() && first.size >= pipeline_min_bytes() &&
                          first.size <= store_object_limit() && store.memory_speed() &&
                          shared_->max_pipelined_stores > 0;
          const bool wanted = pipeline;
          if (pipeline && shared_->pieces && !shared_->pieces->spare_cpu()) pipeline = false;
          PipelineSlot slot(*shared_, pipeline);
          pipeline = slot.taken();
          if (wanted && !pipeline) shared_->process_store_unpipelined_busy.fetch_add(1, std::memory_order_relaxed);
          if (pipeline) {
            const uint64_t need = (first.size + 4095) & ~uint64_t(4095);
            if (need > store_buf_.capacity()) {
              if (Status g = grow_store_buffer(need, deadline); !g.ok()) {
                st[i] = std::move(g);
                i = end;
                continue;
              }
            }
            struct Progress {
              std::mutex mu;
              std::condition_variable cv;
              std::vector<uint8_t> done;  // by piece of kProcessReadPieceBytes
              bool finished = false;      // the reader's job has ended
            };
            auto prog = std::make_shared<Progress>();
            prog->done.assign((first.size + kProcessReadPieceBytes - 1) / kProcessReadPieceBytes, 0);
            ProcessRead rpr{request_id, deadline};
            std::vector<PutItem> ritems(n);
            std::vector<Status> rst(n);
            const std::function<void(size_t, size_t)> on_piece = [prog](size_t off, size_t) {
              std::lock_guard<std::mutex> l(prog->mu);
              prog->done[off / kProcessReadPieceBytes] = 1;
              prog->cv.notify_all();
            };
            // Waits for the reader out of the card gate (it may wait on the
            // client), holding nothing shared; false: the card closed meanwhile.
            auto wait_out = [&](const std::function<bool()>& until) {
              card_leave(shared_->gate);
              {
                std::unique_lock<std::mutex> lk(prog->mu);
                prog->cv.wait(lk, until);
              }
              return card_enter(shared_->gate);
            };
            const auto t0 = Clock::now();
            const bool posted = post_to_reader([&, prog, i, end] {
              read_process_chunk(req, i, end, deadline, &rpr, &ritems, &rst, &on_piece);
              std::lock_guard<std::mutex> l(prog->mu);  // nothing of this frame is touched after it
              prog->finished = true;
              prog->cv.notify_all();
            });
            if (posted) {
              // The place is reserved only once the reader is ahead (its first
              // piece read): a client that stalls from the start holds nothing.
              if (!wait_out([&] { return prog->done[0] || prog->finished; })) {
                abandoned_ = true;
                return Status::Closed("the gateway closed its card while this store's pieces were read");
              }
              bool ahead;
              {
                std::lock_guard<std::mutex> l(prog->mu);
                ahead = prog->done[0];
              }
              bool stalled = false;
              Status put_st = Status::TimedOut("the read from the client's memory ended early");
              if (ahead && !lease) lease = shared_->pool->acquire(deadline);
              if (ahead && !lease) put_st = Status::TimedOut("no I/O context came free before the deadline");
              if (ahead && lease) {
                const uint8_t* buf = store_buf_.data();
                const auto hold_by = Clock::now() + std::chrono::milliseconds(kPipelinePieceWaitMs) +
                                     std::chrono::nanoseconds(first.size * 1000000000ull / kPipelineMinBytesPerSecond);
                PutItem item{first.key, nullptr, first.size};
                item.gave_up = &stalled;  // stored from the buffer next: not a store failure
                item.fill = [&](uint8_t* dst, uint64_t off, size_t len) {
                  for (size_t done = 0; done < len;) {
                    const size_t at = off + done, p = at / kProcessReadPieceBytes;
                    const size_t l = std::min<size_t>(len - done, (p + 1) * kProcessReadPieceBytes - at);
                    {
                      // Each piece within kPipelinePieceWaitMs, the object by hold_by.
                      const auto by = std::min(Clock::now() + std::chrono::milliseconds(kPipelinePieceWaitMs), hold_by);
                      std::unique_lock<std::mutex> lk(prog->mu);
                      if (!prog->cv.wait_until(lk, by, [&] { return prog->done[p] || prog->finished; })) {
                        stalled = true;
                        shared_->process_store_stalls.fetch_add(1, std::memory_order_relaxed);
                        return Status::TimedOut("the client's memory stalled the read: its card place is given up");
                      }
                      if (!prog->done[p]) return Status::TimedOut("the read from the client's memory ended early");
                    }
                    std::memcpy(dst + done, buf + at, l);  // CardStore checksums it where it landed, in the cache
                    done += l;
                  }
                  return Status::Ok();
                };
                store.put(**lease, &item, 1, &put_st, [&] { return Clock::now() < deadline; });
                lease.reset();
                if (stalled) slot.release();  // the card place is given up: another may pipeline
              }
              const auto t1 = Clock::now();
              if (!wait_out([&] { return prog->finished; })) {
                abandoned_ = true;
                return Status::Closed("the gateway closed its card while this store's pieces were read");
              }
              using std::chrono::duration_cast, std::chrono::nanoseconds;
              shared_->process_store_put_ns.fetch_add(duration_cast<nanoseconds>(t1 - t0).count(),
                                                      std::memory_order_relaxed);
              shared_->process_store_read_ns.fetch_add(duration_cast<nanoseconds>(Clock::now() - t1).count(),
                                                       std::memory_order_relaxed);
              if (!rpr.gone.ok()) return rpr.gone;  // the client process exited (or stop() gave up)
              if (rpr.revoked) {
                for (; i < n; i++)
                  st[i] = Status::TimedOut("the client gave up the store (lease revoked): not written");
                break;
              }
              if (stalled && !reader_stalled_) {
                // This connection's stores go through the buffer alone for a while.
                reader_stalled_ = true;
                reader_stalled_at_ = Clock::now();
                ADP_WARN_LIMITED(
                    "gateway: client #%llu (%s): its memory stalled a store's read for over %d ms: "
                    "its stores go through the store buffer alone for %d s",
                    ull(id_), peer().c_str(), kPipelinePieceWaitMs,
                    static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(pipeline_retry_).count()));
              }
              if (!rst[i].ok() || put_st.ok() || !stalled) {
                // Stored; or the read failed (its status is the answer), or the
                // card store did (the deadline, the card).
                st[i] = !rst[i].ok() ? std::move(rst[i]) : std::move(put_st);
                if (st[i].ok()) {
                  shared_->process_stores.fetch_add(1, std::memory_order_relaxed);
                  shared_->process_store_pipelined.fetch_add(1, std::memory_order_relaxed);
                }
                i = end;
                continue;
              }
              // Stalled, and read whole since: stored from the buffer as any other chunk.
              items[i].data = store_buf_.data();
              read_before = true;
            } else {
              reader_stalled_ = true;  // no reader thread: the buffer path for a while
              reader_stalled_at_ = Clock::now();
            }
          }
          if (put_process && !read_before) {
            const auto t0 = Clock::now();
            const bool read = read_process_chunk(req, i, end, deadline, &pr, &items, &st);
            shared_->process_store_read_ns.fetch_add(
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
                std::memory_order_relaxed);
            if (!read) {
              if (!pr.gone.ok()) return pr.gone;  // the client process exited (or stop() gave up): the connection ends
              for (; i < n; i++) st[i] = Status::TimedOut("the client gave up the store (lease revoked): not written");
              break;
            }
          }
          // What is left to store: every item of the chunk but process items not read.
          todo.clear();
          todo_at.clear();
          for (size_t k = i; k < end; k++) {
            if (req.items[k].segment == proto::kProcessSegment && !items[k].data) continue;
            todo.push_back(items[k]);
            todo_at.push_back(k);
          }
          if (todo.empty()) {
            i = end;
            continue;
          }
          if (Clock::now() >= deadline) continue;  // the reads took it: the items left fail above
          if (!lease) lease = shared_->pool->acquire(deadline);
          if (!lease) {
            for (size_t k : todo_at) st[k] = Status::TimedOut("no I/O context came free before the deadline");
            i = end;
            continue;
          }
          if (in_segments && test_segment_delay_ms_)
            std::this_thread::sleep_for(std::chrono::milliseconds(test_segment_delay_ms_));
          if (in_segments && !take_lease(request_id)) {
            for (; i < n; i++)
              if (st[i].ok()) st[i] = Status::TimedOut("the client gave up the store (lease revoked): not written");
            break;
          }
          todo_st.assign(todo.size(), Status::Ok());
          const auto t0 = Clock::now();
          store.put(**lease, todo.data(), todo.size(), todo_st.data(),
                    [&] { return Clock::now() < deadline && intact(); });
          if (put_process)
            shared_->process_store_put_ns.fetch_add(
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
                std::memory_order_relaxed);
          if (in_segments) give_lease(request_id);
          if (put_process) lease.reset();  // the next chunk's reads hold no context
          if (!intact())
            return Status::InvalidArgument("a segment shrank under a store (the client truncated its file)");
          for (size_t t = 0; t < todo.size(); t++) {
            const size_t k = todo_at[t];
            st[k] = std::move(todo_st[t]);
            if (!st[k].ok() || !req.items[k].segment) continue;
            (req.items[k].segment == proto::kProcessSegment ? shared_->process_stores : shared_->segment_stores)
                .fetch_add(1, std::memory_order_relaxed);
          }
          i = end;
        }
        // Another connection waits for room: this one's buffer goes back now.
        if (put_process && shared_->store_buffer_waiters.load()) release_store_buffer();
        break;
      }
      case proto::Op::kGet: {
        bool revoked = false;  // the client gave up: nothing more goes into its segments
        // From its first process load until it waits 20 ms (test_loader_idle_ms_) for a
        // request (run()), a connection with loads: the piece helpers an
        // object may take shrink as such connections grow (PiecePool).
        // Counted per batch instead, the count dipped between one batch
        // and the next of 16 connections on 16 CPUs, and helpers joined
        // objects on CPUs that had none to spare (benchmarks/README.md,
        // "Session eight: loads").
        bool any_process = false;
        for (const auto& it : req.items) any_process |= it.segment == proto::kProcessSegment;
        if (any_process && !loader_ && shared_->pieces)
          loader_ = std::make_unique<PiecePool::Caller>(shared_->pieces.get());
        const uint64_t batch_from = any_process && load_profile::kEnabled ? load_profile::now_ns() : 0;
        for (size_t i = 0; i < n; i++) {
          const proto::BatchItem& it = req.items[i];
          if (Status e = ended(); !e.ok()) return e;
          if (Clock::now() >= deadline) {
            st[i] = Status::TimedOut("deadline passed in the gateway");
            continue;
          }
          if (it.segment == proto::kProcessSegment) {
            // r5: from the card into the client's memory through this
            // connection's bounce buffer, holding nothing shared while it
            // writes. A client gone ends the connection; an address it does
            // not have fails that item alone.
            lease.reset();
            st[i] = load_into_process(it, request_id, deadline, &revoked);
            if (st[i].code() == Status::Code::kClosed) return st[i];
            continue;
          }
          if (!lease) lease = shared_->pool->acquire(deadline);
          if (!lease) {
            st[i] = Status::TimedOut("no I/O context came free before the deadline");
            continue;
          }
          if (it.segment) {
            if (!revoked && test_segment_delay_ms_)
              std::this_thread::sleep_for(std::chrono::milliseconds(test_segment_delay_ms_));
            proto::ClientSegment& seg = *segments_[it.segment - 1];
            auto deliver = [&](size_t size, const CopyFn& copy) {
              if (size != it.size || revoked) return false;
              seg.prepare(it.offset, it.size);  // page tables first, outside the lease
              if (!take_lease(request_id)) {
                revoked = true;
                return false;
              }
              bool ok = copy(seg.data() + it.offset);
              give_lease(request_id);
              return ok;
            };
            // A memory-speed card is read straight into the segment (the
            // lease is held for a memcpy's time); any other card is staged
            // first, so the client's deadline never waits on the card.
            st[i] =
                store.get(**lease, it.key, deliver, store.memory_speed() ? ReadInto::kDestination : ReadInto::kStaging);
            if (seg.broken())
              return Status::InvalidArgument("segment " + std::to_string(it.segment) +
                                             " shrank under a load (the client truncated its file)");
            if (revoked) st[i] = Status::TimedOut("the client gave up the load (lease revoked)");
            if (st[i].ok()) shared_->segment_loads.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
          auto deliver = [&](size_t size, const CopyFn& copy) {
            if (size != it.size) {
              ADP_WARN_LIMITED("object %s holds %zu bytes but the load buffer has %llu: served as a miss",
                               log_safe(it.key).c_str(), size, ull(it.size));
              return false;
            }
            if (base) return copy(base + it.offset);
            size_t at = payload->size();
            payload->resize(at + size);
            if (copy(payload->data() + at)) return true;
            payload->resize(at);
            return false;
          };
          // Ring: the card is read straight into it (a client that gave up
          // drops the connection and its ring). Inline: staged, then copied.
          // r4: in pieces, each published as it lands, so the client copies
          // piece k out while piece k + 1 is read; no piece starts past the
          // deadline (the item then answers TimedOut, a failure, not a miss).
          if (base && ring_progress_) {
            PieceGuardFn piece = [&](size_t upto, const std::function<void()>& read) {
              if (test_piece_delay_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(test_piece_delay_ms_));
              if (Clock::now() >= deadline) return false;
              read();
              publish_progress(i, upto);
              return true;
            };
            st[i] = store.get(**lease, it.key, deliver, ReadInto::kPieces, piece);
            if (st[i].ok()) shared_->ring_piece_loads.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
          st[i] = store.get(**lease, it.key, deliver, base ? ReadInto::kDestination : ReadInto::kStaging);
        }
        if (batch_from) load_profile::add(load_profile::kBatch, load_profile::now_ns() - batch_from);
        break;
      }
      case proto::Op::kExists:
        for (size_t i = 0; i < n; i++) st[i] = store.exists(req.items[i].key) ? Status::Ok() : Status::NotFound();
        break;
      case proto::Op::kDelete:
        for (size_t i = 0; i < n; i++) st[i] = store.remove(**lease, req.items[i].key);
        break;
    }
  }
  for (size_t i = 0; i < n; i++) {
    reply->results[i].size = st[i].ok() ? req.items[i].size : 0;
    reply->results[i].status = std::move(st[i]);
  }
  return Status::Ok();
}

}  // namespace adp
