// SPDX-License-Identifier: Apache-2.0
// Process stores of chunks of several objects (session ten, issue 10 item 2):
// the connection's store reader (and the piece helpers) read a chunk's
// objects into the store buffer while the connection's thread puts each one
// read whole (ClientHandler::store_chunk_overlapped), under ASan and TSan
// (tests/sanitizers/test_sanitizers.py): the reader, the helpers and the
// connection's thread share the store buffer and the chunk's progress.
//
//   chunk_store_test DIR   (DIR on tmpfs: the card images and the sockets)
//
// Gateway 1 (in-process, piece helpers) and two clients (registered process
// memory, raw frames): client A's chunk of six 2 MiB objects stalls 1.5 s in
// the read of its first object's second piece (the test hook) while B stores
// three chunks of six, each object put as read. Checks: every store answers
// Ok, all 24 objects load back byte for byte, the gateway counts them
// overlapped. Gateway 2: a client's chunk stalls 3 s in a read and the
// gateway stops meanwhile (stop() gives up on the connection after 2 s and
// closes the card); the connection's thread must wait for its reader's job
// (which refers to its request's frame: review r9 S1) before it leaves, so
// after the stall neither touches freed memory (ASan) nor races (TSan).

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
#include "protocol/messages.h"
#include "raw_client.h"
#include "test_gateway.h"

namespace {

namespace proto = adp::proto;
using Client = adp::testing::RawClient;
using adp::testing::connect_process_store_client;
using adp::testing::gateway_stats;
using adp::testing::process_batch;
using adp::testing::stat;
constexpr size_t kMiB = 1 << 20;
constexpr size_t kObject = 2 * kMiB + 4099;  // 3 pieces, the last partial; six in one chunk

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::dir_argument(argc, argv, &dir)) return 2;
  // Two connections storing: a spare CPU for each one's store reader on any host (CPUs / 2 >= 2).
  ::setenv("ADP_TEST_GATEWAY_CPUS", "4", 1);
  ::setenv("ADP_STORE_CHUNK_OVERLAP", "1", 1);  // off by default (review r10 R4)
  adp::testing::ProcessObjects objects(30, kObject);
  if (!objects.ok()) return 1;
  const auto &src = objects.src, &dst = objects.dst;
  const auto& want = objects.want;
  std::vector<std::string> keys;
  for (int i = 0; i < 30; i++) keys.push_back((i < 6 ? "A" : i < 24 ? "B" : "C") + std::to_string(i));
  auto range = [](const auto& v, int from, int to) { return std::vector(v.begin() + from, v.begin() + to); };
  {
    const adp::GatewayOptions go = adp::testing::gateway_options(dir, 256, 2);
    std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
    if (!gw) return 1;
    // A's connection reads the hook at its handshake; B's has it too, but the stall is taken once, by A.
    Client a, b;
    ::setenv("ADP_TEST_PROCESS_READ_STALL_MS", "1500", 1);
    const bool a_ok = connect_process_store_client(go.socket_path, "chunk_store_test A", &a);
    ::unsetenv("ADP_TEST_PROCESS_READ_STALL_MS");
    if (!a_ok || !connect_process_store_client(go.socket_path, "chunk_store_test B", &b)) return 1;
    std::vector<adp::Status> a_st;
    std::thread ta([&] { a_st = process_batch(a, proto::Op::kPut, range(keys, 0, 6), range(src, 0, 6), kObject); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // A is in its stalled read
    for (int i = 6; i < 24; i += 6) {
      auto st = process_batch(b, proto::Op::kPut, range(keys, i, i + 6), range(src, i, i + 6), kObject);
      for (int k = 0; k < 6; k++) CHECK(st[k].ok(), "store of %s: %s", keys[i + k].c_str(), st[k].message().c_str());
    }
    ta.join();
    for (int k = 0; k < 6; k++) CHECK(a_st[k].ok(), "store of %s: %s", keys[k].c_str(), a_st[k].message().c_str());
    auto got = process_batch(b, proto::Op::kGet, range(keys, 0, 24), range(dst, 0, 24), kObject);
    for (int i = 0; i < 24; i++) {
      CHECK(got[i].ok(), "load of %s: %s", keys[i].c_str(), got[i].message().c_str());
      CHECK(std::memcmp(dst[i], want[i].data(), kObject) == 0, "%s loads other bytes than were stored",
            keys[i].c_str());
    }
    const std::string st = gateway_stats(b);
    CHECK(stat(st, "process_store_overlapped") == 24, "not 24 overlapped stores: %s", st.c_str());
    ::close(a.fd);
    ::close(b.fd);
    adp::testing::stop_gateway(*gw);
  }
  {
    const adp::GatewayOptions go = adp::testing::gateway_options(dir, 256, 2, "2");
    ::setenv("ADP_TEST_PROCESS_READ_STALL_MS", "3000", 1);
    std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
    if (!gw) return 1;
    Client c;
    const bool c_ok = connect_process_store_client(go.socket_path, "chunk_store_test C", &c);
    ::unsetenv("ADP_TEST_PROCESS_READ_STALL_MS");
    if (!c_ok) return 1;
    std::thread tc(
        [&] { process_batch(c, proto::Op::kPut, range(keys, 24, 30), range(src, 24, 30), kObject, 60, false); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // C is in its stalled read
    const auto t0 = std::chrono::steady_clock::now();
    adp::testing::stop_gateway(*gw);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2900),
          "stop() waited for the stalled read");
    gw.reset();
    tc.join();
    // The stall ends meanwhile: the reader's job and the connection's thread finish, the server gone.
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    ::close(c.fd);
  }
  return adp::testing::finish("chunk_store_test");
}
