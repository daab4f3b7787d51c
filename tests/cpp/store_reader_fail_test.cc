// SPDX-License-Identifier: Apache-2.0
// A connection's store reader that cannot be made, or whose job throws
// (session 26, ADP_TEST_STORE_READER_FAIL): under ASan and TSan
// (tests/sanitizers/test_sanitizers.py); each allocation on the reader failed
// in turn is tests/cpp/thread_alloc_test.cc's part "reader".
//
//   store_reader_fail_test DIR   (DIR on tmpfs: the card images and the socket)
//
// One process is the gateway (in-process, with piece helpers) and its client
// (registered process memory, raw frames), once per hook value:
// - post: no reader (no memory for it): a pipelined store (one 9 MiB object)
//   and an overlapped chunk (two 1 MiB objects, ADP_STORE_CHUNK_OVERLAP=1)
//   go through the store buffer instead: stored, loaded back byte for byte.
//   (029a20f: the bad_alloc ended the connection.)
// - job: every job on the reader throws std::bad_alloc before it reads: the
//   store, and each object of the chunk, is answered "the gateway failed
//   reading this object from the client's memory (out of memory:
//   std::bad_alloc)", not stored; store_reader_failures counts them; the
//   connection and its reader go on (a second store fails the same way, a
//   small store through the buffer is stored), no connection failed.
//   (Before session 26: std::terminate on the reader's thread.)

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "gateway/gateway_server.h"
#include "raw_client.h"
#include "test_gateway.h"

namespace {

namespace proto = adp::proto;
using adp::testing::process_batch;
using adp::testing::stat;
constexpr size_t kMiB = 1 << 20;
constexpr size_t kBig = 9 * kMiB + 4099;  // >= 8 MiB: pipelined
constexpr size_t kSmall = kMiB;           // two of them: a chunk, overlapped
const char* const kReason =
    "out of memory: the gateway failed reading this object from the client's memory (std::bad_alloc)";

void run(const std::string& dir, const std::string& how) {
  const adp::GatewayOptions go = adp::testing::gateway_options(dir, 128, 2, "-" + how);
  // The test hooks are read when the gateway starts (util/test_hooks.h). A spare CPU for the reader on any host.
  ::setenv("ADP_TEST_GATEWAY_CPUS", "4", 1);
  ::setenv("ADP_TEST_STORE_READER_FAIL", how.c_str(), 1);
  std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
  ::unsetenv("ADP_TEST_STORE_READER_FAIL");
  ::unsetenv("ADP_TEST_GATEWAY_CPUS");
  if (!gw) return;
  adp::testing::RawClient c;
  adp::testing::ProcessObjects big(1, kBig), small(2, kSmall);
  if (!adp::testing::connect_process_store_client(go.socket_path, "store_reader_fail_test", &c) || !big.ok() ||
      !small.ok())
    return;
  const std::vector<std::string> chunk = {how + "-s0", how + "-s1"};
  auto st = process_batch(c, proto::Op::kPut, {how + "-big"}, {big.src[0]}, kBig);
  auto chunk_st = process_batch(c, proto::Op::kPut, chunk, small.src, kSmall);
  if (how == "post") {
    CHECK(st[0].ok(), "post: the store through the buffer: %s", st[0].message().c_str());
    for (size_t i = 0; i < 2; i++)
      CHECK(chunk_st[i].ok(), "post: chunk object %zu through the buffer: %s", i, chunk_st[i].message().c_str());
    st = process_batch(c, proto::Op::kGet, {how + "-big"}, {big.dst[0]}, kBig);
    CHECK(st[0].ok() && std::memcmp(big.dst[0], big.want[0].data(), kBig) == 0, "post: the load: %s",
          st[0].message().c_str());
    chunk_st = process_batch(c, proto::Op::kGet, chunk, small.dst, kSmall);
    for (size_t i = 0; i < 2; i++)
      CHECK(chunk_st[i].ok() && std::memcmp(small.dst[i], small.want[i].data(), kSmall) == 0,
            "post: chunk object %zu's load: %s", i, chunk_st[i].message().c_str());
  } else {
    CHECK(!st[0].ok() && st[0].message() == kReason, "job: the pipelined store: '%s'", st[0].message().c_str());
    for (size_t i = 0; i < 2; i++)
      CHECK(!chunk_st[i].ok() && chunk_st[i].message() == kReason, "job: chunk object %zu: '%s'", i,
            chunk_st[i].message().c_str());
    st = process_batch(c, proto::Op::kGet, {how + "-big"}, {big.dst[0]}, kBig);
    CHECK(st[0].is_not_found(), "job: the failed store's load: %s", st[0].message().c_str());
    // The reader goes on: its next job fails the same way; a store of one small object (the buffer) is stored.
    st = process_batch(c, proto::Op::kPut, {how + "-big2"}, {big.src[0]}, kBig);
    CHECK(!st[0].ok() && st[0].message() == kReason, "job: the second store: '%s'", st[0].message().c_str());
    st = process_batch(c, proto::Op::kPut, {chunk[0]}, {small.src[0]}, kSmall);
    CHECK(st[0].ok(), "job: a store through the buffer after: %s", st[0].message().c_str());
  }
  const std::string stats = adp::testing::gateway_stats(c);
  const double want_failures = how == "job" ? 3 : 0;  // the two stores and the chunk
  CHECK(stat(stats, "store_reader_failures") == want_failures, "%s: store_reader_failures %g, want %g", how.c_str(),
        stat(stats, "store_reader_failures"), want_failures);
  // (process_piece_callers is not 0 here: the connection is live, a loader counted until it idles 20 ms.)
  for (const char* key : {"failed_connections", "store_buffer_waiting"})
    CHECK(stat(stats, key) == 0, "%s: %s %g", how.c_str(), key, stat(stats, key));
  CHECK(stat(stats, "process_store_pipelined") == 0, "%s: a store was pipelined", how.c_str());
  ::close(c.fd);
  adp::testing::stop_gateway(*gw);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::dir_argument(argc, argv, &dir)) return 2;
  ::setenv("ADP_STORE_CHUNK_OVERLAP", "1", 1);  // read once, at the first chunk: a chunk goes through the reader
  run(dir, "post");
  run(dir, "job");
  return adp::testing::finish("store_reader_fail_test");
}
