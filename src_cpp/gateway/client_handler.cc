// SPDX-License-Identifier: Apache-2.0
// ClientHandler's connection: the handshake, the request loop, and each batch
// (run_batch; a pipelined process store: process_store.cc). Its other parts:
// process_load.cc, process_store.cc, budgets.cc, ring_words.cc; what they
// share: handler_internal.h.
#include "gateway/client_handler.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "gateway/handler_internal.h"
#include "protocol/auth.h"
#include "util/load_profile.h"
#include "util/log.h"
#include "util/thread_name.h"

namespace adp {
namespace {

using proto::Clock;

bool fits(uint64_t offset, uint64_t len, uint64_t area) { return offset <= area && len <= area - offset; }

// A put is written in chunks of at most this much, its deadline checked between.
constexpr size_t kPutChunkItems = 64;
constexpr uint64_t kPutChunkBytes = 16ull << 20;

// r5 stores: a store buffer is given back once its connection sent nothing
// for this long (mapped again, populated, by its next store). So are the
// connection's frame buffers (a request's body, its reply's table and inline
// payload) once larger than kKeptFrameBytes: a TCP connection's 64 MiB put and
// 64 MiB get left it holding both while it idled (until --idle-timeout-s).
constexpr int kStoreBufferIdleMs = 5000;
constexpr size_t kKeptFrameBytes = 1u << 20;

bool frame_buffers_held(const proto::Frame& frame, const std::vector<uint8_t>& table,
                        const std::vector<uint8_t>& payload) {
  return frame.body.capacity() > kKeptFrameBytes || table.capacity() > kKeptFrameBytes ||
         payload.capacity() > kKeptFrameBytes;
}

void release_frame_buffers(proto::Frame* frame, std::vector<uint8_t>* table, std::vector<uint8_t>* payload) {
  for (std::vector<uint8_t>* v : {&frame->body, table, payload})
    if (v->capacity() > kKeptFrameBytes) std::vector<uint8_t>().swap(*v);
}

// How long a client whose sending side had ended at its HelloOk, and that sent no request, is given to show it
// hung up (a TCP peer's reset in answer to the HelloOk: a round trip) before it counts as one that was there.
// Tests only: ADP_TEST_HANG_UP_WAIT_MS.
constexpr int kHangUpWaitMs = 200;

// Why the gateway ends a status query on the reserve (kStatusQueryReserve): closed quietly, as a status query's end,
// and said in its "gone" line.
constexpr const char* kReserveAnswered = "a status query on the reserve: closed after its answer";
constexpr const char* kReserveTimeUp = "a status query on the reserve: closed, no Stats within the handshake timeout";
}  // namespace

std::string ClientHandler::peer() const {
  if (!peer_.empty()) return peer_;
  char text[96];
  peer_text(text, sizeof text);
  return text;
}

void ClientHandler::peer_text(char* out, size_t size) const noexcept {
  if (!peer_.empty()) {
    std::snprintf(out, size, "%s", peer_.c_str());
  } else if (tcp_) {
    sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char host[64] = "?";
    if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
      ::getnameinfo(reinterpret_cast<sockaddr*>(&sa), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
    std::snprintf(out, size, "tcp %s", host);
  } else {
    ucred cred{};
    socklen_t len = sizeof cred;
    ::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len);
    std::snprintf(out, size, "unix pid %d uid %u", static_cast<int>(cred.pid), static_cast<unsigned>(cred.uid));
  }
}

Status ClientHandler::ended() const {
  if (abandoned_ || !t_in_card) return Status::Closed("the gateway stopped without this connection");
  if (control_ && control_->stopping.load(std::memory_order_relaxed))
    return Status::Closed("the gateway is stopping: the batch in progress ends here");
  return Status::Ok();
}

void ClientHandler::refuse(const Status& why) {
  // Before the handshake the peer is unknown (and may be one of hundreds):
  // those lines are rate-limited. The reason as long as the client's Error frame carries it (kMaxMessageBytes;
  // log_safe's default, 200, cut a segment's refusal before its verdict: debt38b).
  // A reason of printable ASCII only is logged as it is: a segment's refusal has made its path so with log_safe's
  // \xNN escapes, and log_safe again escaped their backslashes (the log said "caf\x5cxc3" where the Error frame
  // says "caf\xc3": review38 of e6cef15). Any other (a control or non-ASCII byte) through log_safe as before.
  const std::string reason = log_printable(why.message(), proto::kMaxMessageBytes);
  if (handshake_done_)
    ADP_WARN("gateway: client #%llu (%s): %s; closing the connection", ull(id_), peer().c_str(), reason.c_str());
  else
    ADP_WARN_LIMITED("gateway: client #%llu (%s): %s; closing the connection", ull(id_), peer().c_str(),
                     reason.c_str());
  if (!torn())
    proto::send_error_frame(fd_, last_request_id_, why.message(), Clock::now() + std::chrono::milliseconds(200));
  proto::finish_sending(fd_);
}

Status ClientHandler::send_frame(proto::FrameType type, uint64_t request_id, std::span<const uint8_t> body,
                                 std::span<const iovec> payload) {
  if (torn()) return torn_why_.ok() ? Status::Closed("a frame to the client was cut part-way") : torn_why_;
  Status s = proto::write_frame(fd_, type, request_id, body, payload, proto::kFramePace, -1, nullptr, &frame_sent_);
  if (s.ok())
    frame_sent_ = 0;
  else if (torn())
    torn_why_ = s;
  return s;
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
    s = Status::InvalidArgument(proto::kTokenRefused);
  const bool status_query = hello.features & proto::kFeatureStatusQuery;
  if (s.ok() && status_query && (hello.features & proto::kClientFeatures)) {
    char features[16];
    std::snprintf(features, sizeof features, "0x%x", hello.features);
    s = Status::InvalidArgument(std::string("a status query (Hello bit 9) asks for no other feature, this one for ") +
                                features + " (a ring, segments, ...: bits 0-8)");
  }
  // A local client is admitted here, not at accept (review N9: a connection in its handshake is neither a client
  // nor a status query yet): --max-clients clients past their Hello at most, status queries not counted.
  const auto max_clients = static_cast<uint32_t>(shared_->limits.max_clients);
  if (s.ok() && !status_query && !tcp_) {
    if (shared_->local_clients.fetch_add(1) >= max_clients) {
      shared_->local_clients--;
      shared_->refused++;
      s = Status::Busy(proto::kTooManyLocalClients + (" (" + std::to_string(max_clients) + ", --max-clients)"));
    } else {
      local_counted_ = true;
    }
  }
  // r16: a local status query is within --max-clients while the local clients and the status queries within it are
  // fewer, else on the reserve (kStatusQueryReserve; bounded at accept, as those within it are not).
  if (s.ok() && status_query && !tcp_) {
    const uint32_t within = shared_->local_queries.fetch_add(1);
    if (shared_->local_clients.load() + within >= max_clients) {
      shared_->local_queries--;
      on_reserve_ = true;
    } else {
      local_query_counted_ = true;
    }
  }
  bool want_ring = hello.features & proto::kFeatureRing;
  if (s.ok() && want_ring != (frame.fds.size() == 1))
    s = Status::InvalidArgument(tcp_ ? "a ring cannot be shared over TCP"
                                     : "ring feature and passed descriptor disagree");
  if (s.ok() && tcp_) {
    // A status query has kStatusQueryReserve more (r15): on a gateway full of TCP clients it is still answered. Those
    // on the reserve are counted apart (r16): one there never holds a slot of --max-tcp-clients.
    const auto max_tcp = static_cast<uint32_t>(shared_->limits.max_tcp_clients);
    if (shared_->tcp_clients.fetch_add(1) < max_tcp) {
      tcp_counted_ = true;
    } else {
      shared_->tcp_clients--;
      if (status_query && shared_->tcp_reserve_queries.fetch_add(1) < kStatusQueryReserve) {
        tcp_reserve_counted_ = true;
        on_reserve_ = true;
      } else {
        if (status_query) shared_->tcp_reserve_queries--;
        (status_query ? shared_->refused_status_queries : shared_->refused)++;  // a status query is no client
        s = Status::Busy(proto::kTooManyTcpClients +
                         (" (" + std::to_string(shared_->limits.max_tcp_clients) + ", --max-tcp-clients)"));
      }
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
    test_piece_delay_ms_ = shared_->hooks.ring_piece_delay_ms;
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
  if (segments_enabled_ || process_offered_) {  // the test hooks, read when the gateway started
    const TestHooks& h = shared_->hooks;
    test_segment_delay_ms_ = h.segment_write_delay_ms;
    test_process_stall_ms_ = h.process_write_stall_ms;
    test_process_stall_on_helper_ = h.process_stall_on_helper;
    test_process_read_stall_ms_ = h.process_read_stall_ms;
    test_process_read_stall_at_start_ = h.process_read_stall_at_start;
    test_process_read_delay_ms_ = h.process_read_piece_delay_ms;
    if (h.pipeline_retry_ms >= 0) pipeline_retry_ = std::chrono::milliseconds(h.pipeline_retry_ms);
    if (h.loader_idle_ms >= 0) test_loader_idle_ms_ = h.loader_idle_ms;
  }
  if (segments_enabled_) {
    ok.features |= proto::kFeatureSegments;
  }
  // r8: no ring, so no alive word: kAlive frames while a batch is worked on.
  alive_frames_ = !ring_ && (hello.features & proto::kFeatureAlive);
  if (alive_frames_) ok.features |= proto::kFeatureAlive;
  // r9: on any transport, to a client that asked (one of r8 or older does not,
  // and gets the reply items of r8: that byte 0).
  error_classes_ = hello.features & proto::kFeatureErrorClass;
  if (error_classes_) ok.features |= proto::kFeatureErrorClass;
  // r10: a status query (Stats requests only), on any transport.
  status_query_ = hello.features & proto::kFeatureStatusQuery;
  if (status_query_) ok.features |= proto::kFeatureStatusQuery;
  ok.max_object_bytes = shared_->store->max_object_bytes();
  ok.server = shared_->description;
  // The client may be gone already: its connect gave up while the gateway was not accepting (a stopped gateway
  // accepts, on resuming, the whole backlog of them at once: audit 13 item 7). Gone is a full hang-up only. A Unix
  // socket whose peer closed reports POLLHUP; a TCP one reports only the end of its read side (POLLRDHUP), as it
  // does for a client that shut down just its sending side and still reads its replies (test_hostile_input's raw
  // exchanges), until the peer answers the HelloOk with a reset (POLLHUP | POLLERR; on loopback before the write
  // returns, over a network a round trip later).
  peer_ = peer();
  pollfd p{fd_, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR))) return gone_before_hello_ok();
  const bool sending_side_ended = p.revents & POLLRDHUP;
  // Counted as what it is before its HelloOk goes: a client that has it finds itself counted so at accept, and in
  // `clients` by a stats read it makes next (brief defects item 4: counted after the write, a read made at once
  // could miss it). A status query is counted at its first Stats (serve_stats); one that asks nothing at its end.
  if (control_) {
    using Phase = ConnectionControl::Phase;
    const Phase phase = !status_query_ ? Phase::kClient : on_reserve_ ? Phase::kReserveQuery : Phase::kStatusQuery;
    control_->phase.store(phase, std::memory_order_seq_cst);
  }
  if (!status_query_) {
    shared_->clients++;
    client_counted_ = true;  // given back in the teardown, whether the HelloOk below goes or not
  }
  std::vector<uint8_t> body;
  proto::encode_hello_ok(ok, &body);
  s = send_frame(proto::FrameType::kHelloOk, frame.header.request_id, body);
  if (s.code() == Status::Code::kClosed) return gone_before_hello_ok();  // EPIPE, ECONNRESET
  if (!s.ok()) return s;
  const std::string how = status_query_ ? std::string("status query")
                          : ring_       ? "ring " + std::to_string(ring_->size() >> 20) + " MiB"
                                        : std::string("payload inline");
  std::string line = "gateway: client #" + std::to_string(id_) + " connected (" + peer_ + ", " +
                     log_safe(hello.client_name) + ", " + how + ")";
  if (!sending_side_ended) {
    log_coming_and_going(line);
  } else if (hung_up(0)) {
    return gone_before_hello_ok();
  } else {
    held_connected_line_ = std::move(line);  // logged with its first request, or at its end unless it hung up
  }
  return s;
}

bool ClientHandler::hung_up(int wait_ms) const {
  pollfd p{fd_, 0, 0};  // POLLHUP and POLLERR are reported unasked; the end of the read side (POLLRDHUP) is not
  return ::poll(&p, 1, wait_ms) > 0 && (p.revents & (POLLHUP | POLLERR));
}

Status ClientHandler::gone_before_hello_ok() {
  gone_before_hello_ok_ = true;
  return Status::Closed("the client hung up before its HelloOk");
}

void ClientHandler::log_coming_and_going(const std::string& line) const {
  if (status_query_)
    ADP_DEBUG("%s", line.c_str());
  else
    ADP_INFO("%s", line.c_str());
}

void ClientHandler::run() noexcept {
  Status s;
  try {
    s = serve();
  } catch (const std::exception& e) {
    if (card_store_unwound()) {
      // The card store's shared state may be half made (a store's ticket that every later store waits behind):
      // going on would hang or lose stores. The process ends as it did for any exception (std::terminate).
      ADP_ERROR("gateway: client #%llu: %s left the card store's operation half done: the gateway cannot go on",
                ull(id_), dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory (std::bad_alloc)" : e.what());
      std::terminate();
    }
    note_failure(e);
  }
  teardown(s);
}

void ClientHandler::note_failure(const std::exception& e) noexcept {
  failed_ = true;
  shared_->failed_connections.fetch_add(1, std::memory_order_relaxed);
  const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
  std::snprintf(failure_, sizeof failure_, "the gateway failed serving this connection (%s)",
                memory ? "out of memory: std::bad_alloc" : e.what());
}

Status ClientHandler::serve() {
  Status s = handshake();
  if (handshake_counted_) {  // counted by the accept thread
    shared_->tcp_handshakes--;
    handshake_counted_ = false;
  }
  if (s.ok()) {
    handshake_done_ = true;
    // Tests only (ADP_TEST_HELLO_OK_DELAY_MS): a client's connection goes on this long after its HelloOk.
    for (auto until = Clock::now() + std::chrono::milliseconds(status_query_ ? 0 : shared_->hooks.hello_ok_delay_ms);
         Clock::now() < until && !(control_ && control_->stopping.load(std::memory_order_relaxed));)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    proto::Frame frame;
    std::vector<uint8_t> table, payload;
    uint32_t max_body = ring_ ? proto::kMaxTableBytes : proto::kMaxFrameBodyBytes;
    const int idle_ms = shared_->limits.idle_timeout_ms;
    while (s.ok()) {
      // The spin saw the socket readable (a byte, the end or an error): each poll below would return at once and
      // change nothing, so none is made (review32b F1: await_frame's poll, and the loader's and the held buffers'
      // idle checks where they apply, were 1-3 syscalls more on the path the spin exists for, ~0.8 us each against
      // a request's ~40 us).
      const bool ready = answered_batch_ && spin_for_next_request();
      const auto idle_by = idle_ms > 0 ? Clock::now() + std::chrono::milliseconds(idle_ms) : proto::kNoDeadline;
      auto reserve_by = proto::kNoDeadline;
      if (on_reserve_) {  // its Stats within the handshake timeout, one only (kStatusQueryReserve)
        if (asked_stats_) {
          reserve_closed_ = kReserveAnswered;
          s = Status::Closed(reserve_closed_);
          break;
        }
        reserve_by = Clock::now() + std::chrono::milliseconds(shared_->limits.handshake_timeout_ms);
      }
      if (loader_ && !ready) {  // no longer counted as loading once it waits this long for its next request
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, test_loader_idle_ms_) == 0) loader_.reset();
      }
      if (!ready && (store_buf_.capacity() || hold_.capacity() || frame_buffers_held(frame, table, payload))) {
        // Neither a store buffer, a load's hold nor large frame buffers are kept by a connection that sent nothing
        // for a while.
        int wait_ms = kStoreBufferIdleMs;
        if (idle_ms > 0) wait_ms = std::min(wait_ms, idle_ms);
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, wait_ms) == 0) {
          release_store_buffer();
          settle_hold(true);
          release_frame_buffers(&frame, &table, &payload);
        }
      }
      // The idle limit is the wait for a next frame's first byte alone (session 32): a client whose frame began is
      // sending, not idle, and its frame's pace governs the rest. Until then read_frame awaited the whole frame
      // until the limit, so a frame that began before it and took longer than what was left of it (a large put on
      // a slow link, 10 s + 1 s/MiB allowed; any request begun just before 600 s of quiet) was cut mid-frame and
      // logged as idle.
      // A frame that began before the spin ended is a frame begun, as await_frame would find it.
      s = ready ? Status::Ok() : proto::await_frame(fd_, std::min(idle_by, reserve_by));
      if (s.code() == Status::Code::kTimedOut) {
        if (reserve_by < idle_by) {
          reserve_closed_ = kReserveTimeUp;
          s = Status::Closed(reserve_closed_);
        } else {
          // Closed quietly, as a restart would: the client reconnects on its next batch.
          ADP_INFO("gateway: client #%llu idle for %d s: closing the connection", ull(id_), idle_ms / 1000);
          s = Status::Closed("idle");
        }
        break;
      }
      // A status query on the reserve is held to its bound for the whole Stats frame, as a Hello to the handshake's.
      if (s.ok()) s = proto::read_frame(fd_, max_body, reserve_by, &frame, segments_enabled_ ? 1 : 0);
      if (s.code() == Status::Code::kTimedOut) {
        if (Clock::now() >= reserve_by) {
          reserve_closed_ = kReserveTimeUp;
          s = Status::Closed(reserve_closed_);
          break;
        }
        // A frame behind its pace (proto::kFrameTimeout + its bytes at kFrameMinBytesPerSecond, session 31; a fixed
        // 10 s for the whole frame before, which cut a live TCP client's 32 MiB put at 2.5 MB/s): read_frame's
        // reason says what came and how far; refused and logged with it (refuse()).
        s = Status::InvalidArgument(s.message());
      }
      if (!s.ok()) break;
      if (!held_connected_line_.empty()) {  // there after all: a request came
        log_coming_and_going(held_connected_line_);
        held_connected_line_.clear();
      }
      const auto type = static_cast<proto::FrameType>(frame.header.type);
      if (status_query_ && type != proto::FrameType::kStats) {  // not counted among the clients: not one either
        proto::close_fds(&frame.fds);
        s = Status::InvalidArgument("frame type " + std::to_string(frame.header.type) +
                                    " on a status query's connection (Hello bit 9): it sends Stats only");
        break;
      }
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
    if (!held_connected_line_.empty()) {
      // A client that sent no request after its Hello. One that hung up (a TCP peer's reset in answer to the
      // HelloOk takes a round trip over a network: bounded by kHangUpWaitMs) was gone before its HelloOk; one that
      // only shut down its sending side is still there, and logged as any other.
      const bool stopping = control_ && control_->stopping.load(std::memory_order_relaxed);  // stop() shuts it down
      const int wait_ms = shared_->hooks.hang_up_wait_ms >= 0 ? shared_->hooks.hang_up_wait_ms : kHangUpWaitMs;
      if (s.code() == Status::Code::kClosed && !stopping && hung_up(wait_ms))
        gone_before_hello_ok_ = true;
      else
        log_coming_and_going(held_connected_line_);
      held_connected_line_.clear();
    }
  }
  return s;
}

void ClientHandler::teardown(const Status& s) noexcept {
  if (handshake_counted_) {  // the handshake threw
    shared_->tcp_handshakes--;
    handshake_counted_ = false;
  }
  // Tests only (ADP_TEST_TEARDOWN_DELAY_MS): the connection, ended, is given back this long later (or at stop()).
  for (auto until = Clock::now() + std::chrono::milliseconds(shared_->hooks.teardown_delay_ms);
       Clock::now() < until && !(control_ && control_->stopping.load(std::memory_order_relaxed));)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
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
  release_store_buffer();
  settle_hold(true);
  process_.reset();
  loader_.reset();
  ring_.reset();
  shared_->ring_bytes_mapped -= ring_reserved_;
  if (tcp_counted_) shared_->tcp_clients--;
  if (tcp_reserve_counted_) shared_->tcp_reserve_queries--;
  if (local_query_counted_) shared_->local_queries--;
  // The counts a stats reader waits on drop last, once all the above is given back: a connection no longer
  // counted in `clients` (or a process no longer in `processes`) has its segments, ring, store buffer and
  // process memory back too (e58a523, review r14a N7).
  if (process_counted_) shared_->processes--;
  if (local_counted_) shared_->local_clients--;
  // A status query that asked nothing: a connector's liveness probe (RemoteBackend::probe), counted apart.
  if (handshake_done_ && status_query_ && !asked_stats_) shared_->status_probes.fetch_add(1, std::memory_order_relaxed);
  if (control_) control_->phase.store(ConnectionControl::Phase::kEnded, std::memory_order_seq_cst);  // see its comment
  if (client_counted_) shared_->clients--;
  // What is left makes text (it may throw: no memory): the counts above are given back whatever happens here.
  try {
    log_end(s);
  } catch (const std::exception&) {
    ADP_ERROR("gateway: client #%llu: its end could not be logged (out of memory)", ull(id_));
  }
}

void ClientHandler::log_end(const Status& s) {
  if (failed_) {
    // Said at ERROR with the peer (peer_ once past the handshake: a TCP peer reset has none later), and to the client
    // where it still reads: its batch, if any, is not answered; the gateway goes on with the other connections.
    // Nothing here allocates (session 30): the failure is often the want of memory, and memory that stays out made
    // the peer's text (peer()) and the frame's body throw, so that the operator read "its end could not be logged"
    // and the client a closed connection, neither the reason.
    char peer[96];
    peer_text(peer, sizeof peer);
    ADP_ERROR("gateway: client #%llu (%s): %s; closing the connection (the gateway serves the others)", ull(id_), peer,
              failure_);
    if (!torn())
      proto::send_error_frame(fd_, last_request_id_, failure_, Clock::now() + std::chrono::milliseconds(200));
    proto::finish_sending(fd_);
  } else if (abandoned_) {
    ADP_INFO("gateway: client #%llu: the transfer stop() gave up on ended (%s); its thread ends", ull(id_),
             log_safe(s.message()).c_str());
  } else if (gone_before_hello_ok_) {
    // One of a backlog that gave up on a stopped gateway, say: DEBUG each, and a count line at INFO from the
    // accept thread (GatewayServer::log_gone_clients), not a "connected" and "gone after 0 batches" pair each.
    ADP_DEBUG("gateway: client #%llu (%s) hung up before its HelloOk", ull(id_), peer().c_str());
    shared_->gone_before_hello_ok.fetch_add(1, std::memory_order_relaxed);
  } else if (s.code() == Status::Code::kClosed && !handshake_done_) {
    // A probe (the image's healthcheck connects and closes, every 30 s; a port check): DEBUG, not a line each
    // time at the default level (audit 12). One refused or malformed keeps its level (refuse()).
    ADP_DEBUG("gateway: client #%llu (%s) closed the connection before its handshake", ull(id_), peer().c_str());
  } else if (reserve_closed_ == kReserveTimeUp) {  // one that holds the reserve and asks nothing: said at INFO
    ADP_INFO("gateway: client #%llu (%s) gone (%s, %d ms)", ull(id_), peer_.c_str(), reserve_closed_,
             shared_->limits.handshake_timeout_ms);
  } else if (reserve_closed_) {
    log_coming_and_going("gateway: client #" + std::to_string(id_) + " gone (" + reserve_closed_ + ")");
  } else if (s.code() == Status::Code::kClosed) {
    log_coming_and_going(
        "gateway: client #" + std::to_string(id_) +
        (status_query_ ? " gone (a status query)" : " gone after " + std::to_string(served_) + " batches"));
  } else {
    refuse(s);
  }
}

Status ClientHandler::serve_batch(const proto::Frame& frame, std::vector<uint8_t>* table,
                                  std::vector<uint8_t>* payload) {
  if (frame.header.type != static_cast<uint8_t>(proto::FrameType::kBatch))
    return Status::InvalidArgument("unexpected frame type " + std::to_string(frame.header.type) +
                                   " after the handshake");
  const auto read_at = Clock::now();  // the request is read: batch_put_ns / batch_get_ns count from here
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
  {
    // Counted while the batch runs, given back however it ends (an exception included: session 25).
    CountedWhile in_use(shared_->ring_bytes_in_use, in_ring);
    alive_request_id_ = frame.header.request_id;
    alive_sent_at_ = Clock::now();  // the first kAlive (r8) once the batch has taken kAliveFrameEvery
    s = run_batch(req, frame.header.request_id, &reply, payload);
  }
  if (!s.ok()) return s;
  table->clear();
  proto::encode_batch_reply(reply, table, error_classes_);
  iovec iv{payload->data(), payload->size()};
  served_++;
  shared_->batches.fetch_add(1, std::memory_order_relaxed);
  const bool put_or_get = req.op == proto::Op::kPut || req.op == proto::Op::kGet;
  if (put_or_get) {  // counted before the reply goes: a client that reads stats after it finds them counted
    const bool put = req.op == proto::Op::kPut;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - read_at).count();
    (put ? shared_->batch_puts : shared_->batch_gets).fetch_add(1, std::memory_order_relaxed);
    (put ? shared_->batch_put_ns : shared_->batch_get_ns).fetch_add(ns, std::memory_order_relaxed);
  }
  s = send_frame(proto::FrameType::kBatchReply, frame.header.request_id, *table, {&iv, payload->empty() ? 0u : 1u});
  // A client asleep on the ticket then finds the reply on the socket.
  if (ring_progress_ && req.op == proto::Op::kGet) bump_ticket();
  answered_batch_ = s.ok() && put_or_get;
  return s;
}

bool ClientHandler::spin_for_next_request() {
  answered_batch_ = false;
  const auto spin = shared_->request_spin;
  if (spin.count() <= 0 || !shared_->spin_load.allows(shared_->clients.load(std::memory_order_relaxed))) return false;
  shared_->batch_spins.fetch_add(1, std::memory_order_relaxed);
  // A request, a hang-up or an error: read_frame tells which.
  const short revents = spin_poll(fd_, Clock::now() + spin);
  if (revents & POLLIN) shared_->batch_spin_hits.fetch_add(1, std::memory_order_relaxed);
  return revents != 0;
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
  s = proto::ClientSegment::Attach(fds[0], reg.bytes, shared_->max_segment_total_bytes, &segments_[reg.id - 1]);
  if (!s.ok()) return s;
  shared_->segments++;
  ADP_DEBUG("gateway: client #%llu registered segment %u (%llu MiB)", ull(id_), reg.id, ull(reg.bytes >> 20));
  // Its pages' page tables in the background, so its first loads need not (queued: this reply waits for nothing).
  if (shared_->segment_prefault) shared_->segment_prefault->add(*segments_[reg.id - 1]);
  return send_frame(proto::FrameType::kSegmentOk, frame->header.request_id, {});
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
    process_counted_ = true;
    ADP_DEBUG("gateway: client #%llu granted process memory (pid %d)", ull(id_), process_->pid());
  } else {
    ok.reason = s.message();
    shared_->process_refusals++;
    ADP_INFO("gateway: client #%llu (%s): process memory refused, the ring stays: %s", ull(id_), peer().c_str(),
             log_safe(s.message()).c_str());
  }
  std::vector<uint8_t> body;
  proto::encode_process_ok(ok, &body);
  return send_frame(proto::FrameType::kProcessOk, frame.header.request_id, body);
}

Status ClientHandler::serve_stats(const proto::Frame& frame) {
  Status s = check_request_id(frame);
  if (!s.ok()) return s;
  if (!frame.body.empty()) return Status::InvalidArgument("stats request with a body");
  CardSection in_card(shared_->gate);
  if (!in_card) return Status::Closed("the gateway is closing its card");
  if (status_query_ && !asked_stats_) shared_->status_queries.fetch_add(1, std::memory_order_relaxed);  // before:
  asked_stats_ = true;  // its own reply counts it
  std::string json = stats_json(shared_->store->stats(), *shared_);
  std::vector<uint8_t> body(json.begin(), json.end());
  return send_frame(proto::FrameType::kStatsReply, frame.header.request_id, body);
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
  auto lease = no_ctx ? nullptr : acquire_context(deadline);
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
          bool read_before = false;  // the chunk is in store_buf_ already (a pipelined store that stalled)
          if (put_process && end == i + 1 && req.items[i].segment == proto::kProcessSegment) {
            Pipelined how;
            if (Status e = store_pipelined(req.items[i], request_id, deadline, &st[i], &how); !e.ok()) return e;
            if (how == Pipelined::kRevoked) {
              for (; i < n; i++) st[i] = Status::TimedOut("the client gave up the store (lease revoked): not written");
              break;
            }
            if (how == Pipelined::kAnswered) {
              i = end;
              continue;
            }
            if (how == Pipelined::kReadWhole) {
              // Stalled (or no slot), and read whole since: stored from the buffer as any other chunk.
              items[i].data = store_buf_.data();
              read_before = true;
            }
          }
          if (put_process && !read_before && end - i >= 2) {
            Overlapped how;
            if (Status e = store_chunk_overlapped(req, request_id, i, end, deadline, &st, &how); !e.ok()) return e;
            if (how == Overlapped::kRevoked) {
              for (i = end; i < n; i++)
                st[i] = Status::TimedOut("the client gave up the store (lease revoked): not written");
              break;
            }
            if (how == Overlapped::kDone) {
              i = end;
              continue;
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
          if (!lease) lease = acquire_context(deadline);
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
          note_card_work();  // a chunk stored under the context
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
            bump_alive();  // its read under a context counted as card work already (with_ctx)
            continue;
          }
          namespace prof = load_profile;
          const uint64_t item_from = it.segment && prof::kEnabled ? prof::now_ns() : 0;  // seg_item
          if (!lease) {
            lease = acquire_context(deadline);
            if (item_from) prof::add(prof::kSegContext, prof::now_ns() - item_from);
          }
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
              // Page tables first, outside the lease (pages populated before: no call).
              {
                prof::Timer t(prof::kSegPrepare);
                if (seg.prepare(it.offset, it.size)) shared_->segment_populates.fetch_add(1, std::memory_order_relaxed);
              }
              uint64_t lease_ns = item_from ? prof::now_ns() : 0;
              if (!take_lease(request_id)) {
                revoked = true;
                return false;
              }
              if (item_from) lease_ns = prof::now_ns() - lease_ns;
              bool ok;
              {
                prof::Timer t(prof::kSegCopy);
                ok = copy(seg.data() + it.offset);
              }
              const uint64_t give_from = item_from ? prof::now_ns() : 0;
              give_lease(request_id);
              if (item_from) prof::add(prof::kSegLease, lease_ns + prof::now_ns() - give_from);
              return ok;
            };
            // A memory-speed card is read straight into the segment (the
            // lease is held for a memcpy's time); any other card is staged
            // first, so the client's deadline never waits on the card.
            {
              prof::Timer t(prof::kSegGet);
              st[i] = store.get(**lease, it.key, deliver,
                                store.memory_speed() ? ReadInto::kDestination : ReadInto::kStaging);
            }
            if (item_from) prof::add(prof::kSegItem, prof::now_ns() - item_from);
            if (seg.broken())
              return Status::InvalidArgument("segment " + std::to_string(it.segment) +
                                             " shrank under a load (the client truncated its file)");
            if (revoked) st[i] = Status::TimedOut("the client gave up the load (lease revoked)");
            if (st[i].ok()) shared_->segment_loads.fetch_add(1, std::memory_order_relaxed);
            note_card_work();  // store.get returned, under the context
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
              if (test_piece_delay_ms_) {
                // The line a test waits for: this connection holds its I/O context, its read "hung" from here.
                ADP_DEBUG(
                    "gateway: client #%llu: a ring piece's read waits %d ms under its I/O context "
                    "(ADP_TEST_RING_PIECE_DELAY_MS)",
                    ull(id_), test_piece_delay_ms_);
                std::this_thread::sleep_for(std::chrono::milliseconds(test_piece_delay_ms_));
              }
              if (Clock::now() >= deadline) return false;
              read();
              publish_progress(i, upto);
              return true;
            };
            st[i] = store.get(**lease, it.key, deliver, ReadInto::kPieces, piece);
            if (st[i].ok()) shared_->ring_piece_loads.fetch_add(1, std::memory_order_relaxed);
            note_card_work();
            continue;
          }
          st[i] = store.get(**lease, it.key, deliver, base ? ReadInto::kDestination : ReadInto::kStaging);
          note_card_work();
        }
        if (batch_from) load_profile::add(load_profile::kBatch, load_profile::now_ns() - batch_from);
        break;
      }
      case proto::Op::kExists:  // the index only, no context: a sign of life per item (review r10 N3)
        for (size_t i = 0; i < n; i++) {
          const bool found = store.exists(req.items[i].key);
          st[i] = found ? Status::Ok() : Status::NotFound();
          (found ? shared_->lookup_hits : shared_->lookup_misses).fetch_add(1, std::memory_order_relaxed);
          bump_alive();
        }
        break;
      case proto::Op::kDelete:
        for (size_t i = 0; i < n; i++) {
          st[i] = store.remove(**lease, req.items[i].key);
          note_card_work();  // under the context (review r10 N3)
        }
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
