// SPDX-License-Identifier: Apache-2.0
// A hand-driven client of an in-process gateway for the C++ test programs of
// tests/cpp: a Unix connection with a ring, Hello, and this process's memory
// registered (RegisterProcess / ProcessOk), speaking raw frames. Failures are
// CHECKs (check.h); the functions say whether the step worked so a program can
// stop early.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "protocol/frame.h"
#include "protocol/messages.h"
#include "protocol/shared_ring.h"
#include "protocol/socket_io.h"

namespace adp::testing {

// A deadline `seconds` from now.
inline proto::Deadline in_seconds(int seconds) { return proto::Clock::now() + std::chrono::seconds(seconds); }

struct RawClient {
  int fd = -1;
  std::unique_ptr<proto::SharedRing> ring;
  uint64_t rid = 0;  // the last request id sent (Hello is 1, RegisterProcess 2)
  uint8_t probe[16];
};

// Connects to unix://socket with a 4 MiB ring and Hello `features`, then registers this process's
// memory; true when the gateway granted every feature of `want` in ProcessOk. Frames wait up to
// `timeout_s` seconds each.
inline bool connect_raw_client(const std::string& socket, const char* name, uint32_t features, uint32_t want,
                               RawClient* c, int timeout_s = 10) {
  proto::Endpoint ep;
  proto::parse_endpoint("unix://" + socket, &ep);
  Status s = proto::connect_endpoint(ep, in_seconds(timeout_s), &c->fd);
  CHECK(s.ok(), "%s: connect: %s", name, s.message().c_str());
  s = proto::SharedRing::Create(4 << 20, &c->ring);
  CHECK(s.ok(), "%s: ring: %s", name, s.message().c_str());
  if (c->fd < 0 || !c->ring) return false;
  std::vector<uint8_t> body;
  proto::Hello hello;
  hello.features = features;
  hello.ring_bytes = c->ring->size();
  hello.client_name = name;
  proto::encode_hello(hello, &body);
  proto::write_frame(c->fd, proto::FrameType::kHello, ++c->rid, body, {}, in_seconds(timeout_s), c->ring->fd());
  proto::Frame f;
  const bool hello_ok = proto::read_frame(c->fd, 1 << 20, in_seconds(timeout_s), &f).ok() &&
                        f.header.type == uint8_t(proto::FrameType::kHelloOk);
  CHECK(hello_ok, "%s: no HelloOk", name);
  if (!hello_ok) return false;
  for (size_t i = 0; i < sizeof c->probe; i++) c->probe[i] = uint8_t(i * 7 + 3);
  proto::RegisterProcess reg;
  reg.pid = static_cast<uint32_t>(::getpid());
  reg.probe_addr = reinterpret_cast<uintptr_t>(c->probe);
  reg.probe = c->probe;
  body.clear();
  proto::encode_register_process(reg, &body);
  proto::write_frame(c->fd, proto::FrameType::kRegisterProcess, ++c->rid, body, {}, in_seconds(timeout_s));
  proto::ProcessOk ok;
  const bool granted = proto::read_frame(c->fd, 1 << 20, in_seconds(timeout_s), &f).ok() &&
                       f.header.type == uint8_t(proto::FrameType::kProcessOk) &&
                       proto::decode_process_ok(f.body, &ok).ok() && (ok.features & want) == want;
  CHECK(granted, "%s: process features %#x not granted: %.*s", name, want, int(ok.reason.size()), ok.reason.data());
  return granted;
}

// A client that stores from its own memory (r5): ring, process loads and stores offered, process
// stores required.
inline bool connect_process_store_client(const std::string& socket, const char* name, RawClient* c,
                                         int timeout_s = 60) {
  return connect_raw_client(socket, name,
                            proto::kFeatureRing | proto::kFeatureProcessLoads | proto::kFeatureProcessStores,
                            proto::kFeatureProcessStores, c, timeout_s);
}

// n bytes of anonymous memory, populated; nullptr if mmap fails (munmap it when done).
inline uint8_t* populated_buffer(size_t n) {
  auto* p = static_cast<uint8_t*>(
      ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  return p == MAP_FAILED ? nullptr : p;
}

// n objects of `size` bytes for process stores and loads: object i's bytes (want[i], pattern seed i + 1),
// a populated buffer holding them (src[i]) and one to load into (dst[i]); unmapped when it goes.
struct ProcessObjects {
  ProcessObjects(int n, size_t size) : size(size) {
    for (int i = 0; i < n; i++) {
      want.push_back(pattern(size, uint8_t(i + 1)));
      src.push_back(populated_buffer(size));
      dst.push_back(populated_buffer(size));
      if (src.back()) std::memcpy(src.back(), want.back().data(), size);
    }
    CHECK(ok(), "mmap of %d x 2 buffers of %zu bytes", n, size);
  }
  ~ProcessObjects() {
    for (uint8_t* p : src)
      if (p) ::munmap(p, size);
    for (uint8_t* p : dst)
      if (p) ::munmap(p, size);
  }
  ProcessObjects(const ProcessObjects&) = delete;
  ProcessObjects& operator=(const ProcessObjects&) = delete;
  bool ok() const {
    for (size_t i = 0; i < src.size(); i++)
      if (!src[i] || !dst[i]) return false;
    return true;
  }
  size_t size;
  std::vector<std::vector<uint8_t>> want;
  std::vector<uint8_t*> src, dst;
};

// One batch of process items of `size` bytes each (keys[i] at bufs[i]) under an open lease; each item's
// status (IoError "no reply" for all when none came within `timeout_s`). want_reply false: the gateway
// stops meanwhile; the reply, if any, is read and dropped (an empty result).
inline std::vector<Status> process_batch(RawClient& c, proto::Op op, const std::vector<std::string>& keys,
                                         const std::vector<uint8_t*>& bufs, size_t size, int timeout_s = 60,
                                         bool want_reply = true) {
  const uint64_t rid = ++c.rid;
  __atomic_store_n(reinterpret_cast<uint64_t*>(c.ring->data()), proto::lease_word(rid, proto::kLeaseOpen),
                   __ATOMIC_RELEASE);
  proto::BatchRequest req;
  req.op = op;
  req.timeout_ms = timeout_s * 1000;
  for (size_t i = 0; i < keys.size(); i++)
    req.items.push_back({keys[i], size, reinterpret_cast<uintptr_t>(bufs[i]), proto::kProcessSegment});
  std::vector<uint8_t> body;
  proto::encode_batch(req, &body);
  proto::write_frame(c.fd, proto::FrameType::kBatch, rid, body, {}, in_seconds(timeout_s));
  proto::Frame f;
  if (!want_reply) {
    proto::read_frame(c.fd, 1 << 20, in_seconds(timeout_s), &f);
    return {};
  }
  proto::BatchReply reply;
  const bool got = proto::read_frame(c.fd, 1 << 20, in_seconds(timeout_s), &f).ok() &&
                   f.header.type == uint8_t(proto::FrameType::kBatchReply) &&
                   proto::decode_batch_reply(f.body, &reply).ok() && reply.results.size() == keys.size();
  CHECK(got, "no batch reply (frame type %d)", int(f.header.type));
  std::vector<Status> out;
  for (auto& r : reply.results) out.push_back(r.status);
  if (!got) out.assign(keys.size(), Status::IoError("no reply"));
  return out;
}

// The ring's lease word as the client reads it after its last request's reply: lease_word(c.rid, kLeaseOpen) once
// the gateway gave the lease back (kLeaseWriting: one left held, which a real client's revoke would wait on).
inline uint64_t lease_word_now(const RawClient& c) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(c.ring->data()), __ATOMIC_ACQUIRE);
}
inline bool lease_given_back(const RawClient& c) {
  return lease_word_now(c) == proto::lease_word(c.rid, proto::kLeaseOpen);
}

// The gateway's StatsReply body (JSON), "" if none came.
inline std::string gateway_stats(RawClient& c, int timeout_s = 60) {
  proto::write_frame(c.fd, proto::FrameType::kStats, ++c.rid, {}, {}, in_seconds(timeout_s));
  proto::Frame f;
  if (!proto::read_frame(c.fd, 1 << 20, in_seconds(timeout_s), &f).ok()) return "";
  return std::string(f.body.begin(), f.body.end());
}

// A number in the stats JSON ("key":value), -1 if absent.
inline double stat(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  return at == std::string::npos ? -1 : std::strtod(json.c_str() + at + key.size() + 3, nullptr);
}

}  // namespace adp::testing
