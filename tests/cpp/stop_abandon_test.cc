// SPDX-License-Identifier: Apache-2.0
// A gateway's stop() leaves a load behind, and the process lives on after it
// (review r7 B1): the thread left behind must touch nothing of the closed
// card or the freed I/O context pool when its transfer ends. Built and run
// under AddressSanitizer by tests/sanitizers/test_sanitizers.py
// (test_stop_left_behind_touches_no_freed_card_under_asan), which is what
// turns a use after free into a failure.
//
//   stop_abandon_test DIR
//
// DIR (tmpfs) holds the card image and the socket. One process is the
// gateway (in-process, with piece helpers) and its client (registered
// process memory, raw frames). The client gets two process items: K1, whose
// buffer's tail is not mapped (a piece fails EFAULT on the connection's
// thread) while a helper's piece of it stalls 4 s (the test hook, counted as
// a transfer of the client's memory), then K2. stop() gives up on the
// stalled connection after 2 s and closes the card; the helper wakes 2 s
// later. Checks: no reply and nothing written into K2's buffer (the
// request ended with the stop), and no sanitizer report.

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "gateway/gateway_server.h"
#include "raw_client.h"
#include "store/card_store.h"
#include "test_card.h"
#include "test_gateway.h"

namespace {

constexpr size_t kMiB = 1 << 20;
constexpr size_t kK1 = 32 * kMiB, kK2 = 1 * kMiB, kHole = 1 * kMiB;
constexpr uint32_t kStallMs = 4000;

adp::proto::Deadline soon() { return adp::testing::in_seconds(10); }

bool store_objects(const std::string& card) {
  auto s = adp::testing::checked_card(adp::testing::card_options(64 * kMiB, card, 1024 * kMiB), "open " + card);
  if (!s) return false;
  std::vector<uint8_t> a(kK1, 0x11), b(kK2, 0x22);
  adp::IoContext ctx;
  adp::PutItem items[2] = {{"K1", a.data(), a.size()}, {"K2", b.data(), b.size()}};
  adp::Status res[2];
  s->put(ctx, items, 2, res, [] { return true; });
  CHECK(res[0].ok() && res[1].ok(), "put: %s / %s", res[0].message().c_str(), res[1].message().c_str());
  return res[0].ok() && res[1].ok();
}

// Reads the next frame; false once the gateway closed the connection (or nothing came by `by`).
bool next_frame(int fd, adp::proto::Deadline by, adp::proto::Frame* f) {
  return adp::proto::read_frame(fd, 1 << 20, by, f).ok();
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::dir_argument(argc, argv, &dir)) return 2;
  const adp::GatewayOptions go = adp::testing::gateway_options(dir, 0, 2);  // on the card store_objects made
  if (!store_objects(go.card.path)) return 1;

  // Read when the gateway starts (util/test_hooks.h): the first helper write
  // past an object's first piece stalls this long (ClientHandler's test hook).
  ::setenv("ADP_TEST_PROCESS_WRITE_STALL_MS", std::to_string(kStallMs).c_str(), 1);
  ::setenv("ADP_TEST_PROCESS_WRITE_STALL_ON", "helper", 1);
  std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
  if (!gw) return 1;

  adp::testing::RawClient client;
  if (!adp::testing::connect_raw_client(go.socket_path, "stop_abandon_test",
                                        adp::proto::kFeatureRing | adp::proto::kFeatureProcessLoads,
                                        adp::proto::kFeatureProcessLoads, &client))
    return 1;
  const int fd = client.fd;

  // K1's buffer with its last MiB not mapped writable; K2's filled with a mark.
  uint8_t* b1 = adp::testing::populated_buffer(kK1);
  uint8_t* b2 = adp::testing::populated_buffer(kK2);
  CHECK(b1 && b2, "mmap");
  if (!b1 || !b2) return 1;
  ::mprotect(b1 + kK1 - kHole, kHole, PROT_NONE);
  std::memset(b2, 0xAB, kK2);

  const uint64_t rid = ++client.rid;
  __atomic_store_n(reinterpret_cast<uint64_t*>(client.ring->data()),
                   adp::proto::lease_word(rid, adp::proto::kLeaseOpen), __ATOMIC_RELEASE);
  adp::proto::BatchRequest req;
  req.op = adp::proto::Op::kGet;
  req.timeout_ms = 600000;
  req.items = {{"K1", kK1, reinterpret_cast<uintptr_t>(b1), adp::proto::kProcessSegment},
               {"K2", kK2, reinterpret_cast<uintptr_t>(b2), adp::proto::kProcessSegment}};
  std::vector<uint8_t> body;
  adp::proto::encode_batch(req, &body);
  adp::proto::write_frame(fd, adp::proto::FrameType::kBatch, rid, body, {}, soon());

  // The helper's piece stalls: no reply before it ends (a reply now means
  // no helper took a piece, and the test did not test what it should).
  pollfd p{fd, POLLIN, 0};
  const bool replied = ::poll(&p, 1, 1000) > 0;
  CHECK(!replied, "the get was answered at once: no piece helper stalled (the scenario did not happen)");

  adp::testing::stop_gateway(*gw);
  // The process lives on past the stall: the thread left behind wakes now.
  std::this_thread::sleep_for(std::chrono::milliseconds(kStallMs + 2000));

  adp::proto::Frame f;
  CHECK(!next_frame(fd, adp::proto::Clock::now() + std::chrono::seconds(2), &f),
        "a frame (type %d) came after stop() gave the connection up", int(f.header.type));
  size_t written = 0;
  for (size_t i = 0; i < kK2; i++) written += b2[i] != 0xAB;
  CHECK(written == 0, "%zu bytes of K2 were written after stop() gave the connection up", written);

  gw.reset();
  ::close(fd);
  ::munmap(b1, kK1);
  ::munmap(b2, kK2);
  return adp::testing::finish("stop_abandon_test");
}
