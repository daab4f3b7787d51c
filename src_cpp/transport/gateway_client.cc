// SPDX-License-Identifier: Apache-2.0
#include "transport/gateway_client.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <random>

namespace adp {

Status GatewayClient::Connect(const GatewayClientOptions& opts, proto::Deadline deadline,
                              std::unique_ptr<GatewayClient>* out) {
  // The ring first: the gateway's handshake clock starts at connect.
  std::unique_ptr<proto::SharedRing> ring;
  if (opts.endpoint.kind == proto::Endpoint::Kind::kUnix && opts.ring_bytes) {
    Status s = proto::SharedRing::Create(opts.ring_bytes, &ring);
    if (!s.ok()) return s;
  }
  int fd = -1;
  Status s = proto::connect_endpoint(opts.endpoint, deadline, &fd);
  if (!s.ok()) return s;
  std::unique_ptr<GatewayClient> c(new GatewayClient(fd));
  c->ring_ = std::move(ring);
  s = c->handshake(opts, deadline);
  if (!s.ok()) return s;
  *out = std::move(c);
  return Status::Ok();
}

GatewayClient::~GatewayClient() { ::close(fd_); }

void GatewayClient::interrupt() const { ::shutdown(fd_, SHUT_RDWR); }

Status GatewayClient::handshake(const GatewayClientOptions& opts, proto::Deadline deadline) {
  proto::Hello hello;
  if (ring_) {
    hello.features = proto::kFeatureRing |
                     (opts.segments ? proto::kFeatureSegments | proto::kFeatureSegmentStores : 0) |
                     (opts.ring_progress ? proto::kFeatureRingProgress : 0) |
                     (opts.process_memory ? proto::kFeatureProcessMemory | proto::kFeatureStoreLimit : 0);
    hello.ring_bytes = ring_->size();
  }
  hello.token = opts.token;
  hello.client_name = opts.client_name;
  table_.clear();
  proto::encode_hello(hello, &table_);
  Status s =
      proto::write_frame(fd_, proto::FrameType::kHello, ++request_id_, table_, {}, deadline, ring_ ? ring_->fd() : -1);
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
  process_offered_ = ring_ && opts.process_memory ? limits_.features & proto::kFeatureProcessMemory : 0;
  if (segments_ || process_offered_) {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) peer_pid_ = cred.pid;
  }
  server_ = std::string(limits_.server);
  limits_.server = server_;  // the frame buffer is reused
  return process_offered_ ? register_process(deadline) : Status::Ok();
}

namespace {
// The gateway this process named with PR_SET_PTRACER (0: none yet). The
// kernel keeps one per process: never overwritten, never cleared (another
// connection to that gateway may still need it).
std::mutex g_ptracer_mu;
pid_t g_ptracer = 0;
}  // namespace

void GatewayClient::withdraw_process(const std::string& why) {
  process_granted_ = 0;
  process_refusal_ = why;
}

Status GatewayClient::register_process(proto::Deadline deadline) {
  // Yama (kernel.yama.ptrace_scope): 0 lets a process of the same uid read
  // and write this one; 1 only a process this one named (one per process:
  // the first gateway named keeps it, see g_ptracer); 2 and 3 no one: the ring.
  int scope = 0;
  std::ifstream("/proc/sys/kernel/yama/ptrace_scope") >> scope;
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
    // One ptracer per process, so one record per process: named once, by
    // the first connection that needs it; a connection to another gateway
    // then keeps the ring instead of taking the grant from the first.
    std::lock_guard<std::mutex> l(g_ptracer_mu);
    if (g_ptracer != 0 && g_ptracer != peer_pid_) {
      process_refusal_ = "Yama ptrace_scope is 1 and this process already names gateway pid " +
                         std::to_string(g_ptracer) + " with PR_SET_PTRACER (one per process)";
      return Status::Ok();
    }
    if (g_ptracer == 0) {
      if (::prctl(PR_SET_PTRACER, static_cast<unsigned long>(peer_pid_), 0, 0, 0) != 0) {
        process_refusal_ = "prctl(PR_SET_PTRACER) failed: " + errno_text(errno);
        return Status::Ok();
      }
      g_ptracer = peer_pid_;
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
  Status s = proto::write_frame(fd_, proto::FrameType::kRegisterProcess, ++request_id_, table_, {}, deadline);
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

Status GatewayClient::receive(uint8_t type, proto::Deadline deadline) {
  Status s = proto::read_frame(fd_, proto::kMaxFrameBodyBytes, deadline, &frame_);
  if (!s.ok()) return s;
  if (frame_.header.type == static_cast<uint8_t>(proto::FrameType::kError)) {
    std::string_view reason;
    s = proto::decode_error(frame_.body, &reason);
    return Status::Unavailable("gateway refused: " + std::string(s.ok() ? reason : "(unreadable reason)"));
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
  Status s = proto::write_frame(fd_, proto::FrameType::kRegisterSegment, ++request_id_, table_, {}, deadline, fd);
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
  return proto::write_frame(fd_, proto::FrameType::kBatch, ++request_id_, table_, payload, deadline);
}

bool GatewayClient::readable() const {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

Status GatewayClient::await_reply(const proto::BatchRequest& req, proto::Deadline deadline, proto::BatchReply* reply) {
  Status s = receive(static_cast<uint8_t>(proto::FrameType::kBatchReply), deadline);
  if (s.ok()) s = proto::decode_batch_reply(frame_.body, reply);
  if (s.ok() && reply->results.size() != req.items.size())
    s = Status::InvalidArgument("gateway answered " + std::to_string(reply->results.size()) + " results for " +
                                std::to_string(req.items.size()) + " keys");
  return s;
}

}  // namespace adp
