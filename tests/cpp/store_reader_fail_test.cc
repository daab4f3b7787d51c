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
// - read (session 27): the reader's reads of client memory throw std::bad_alloc
//   while it holds the client's lease: the same answers as job, and after
//   each reply the ring's lease word is OPEN for that request (the lease
//   given back: a real client's revoke would wait on one left WRITING).
//   Red with the lease left only after a read that returned (04b6a11's
//   LeaseLeave guard removed): "read: the pipelined store's lease word".

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
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
  // After each store's reply the lease is the client's again (OPEN for that request).
  auto lease_back = [&](const char* what) {
    CHECK(adp::testing::lease_given_back(c), "%s: the %s's lease word %#llx, want OPEN for request %llu (%#llx)",
          how.c_str(), what, static_cast<unsigned long long>(adp::testing::lease_word_now(c)),
          static_cast<unsigned long long>(c.rid),
          static_cast<unsigned long long>(proto::lease_word(c.rid, proto::kLeaseOpen)));
    if (!adp::testing::lease_given_back(c)) {  // the next requests and stop() would wait on it: ended here
      adp::testing::finish("store_reader_fail_test");
      std::fflush(stdout);
      std::_Exit(1);
    }
  };
  auto st = process_batch(c, proto::Op::kPut, {how + "-big"}, {big.src[0]}, kBig);
  lease_back("pipelined store");
  auto chunk_st = process_batch(c, proto::Op::kPut, chunk, small.src, kSmall);
  lease_back("chunk");
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
    CHECK(!st[0].ok() && st[0].message() == kReason, "%s: the pipelined store: '%s'", how.c_str(),
          st[0].message().c_str());
    for (size_t i = 0; i < 2; i++)
      CHECK(!chunk_st[i].ok() && chunk_st[i].message() == kReason, "%s: chunk object %zu: '%s'", how.c_str(), i,
            chunk_st[i].message().c_str());
    st = process_batch(c, proto::Op::kGet, {how + "-big"}, {big.dst[0]}, kBig);
    CHECK(st[0].is_not_found(), "%s: the failed store's load: %s", how.c_str(), st[0].message().c_str());
    // The reader goes on: its next job fails the same way; a store of one small object (the buffer) is stored.
    st = process_batch(c, proto::Op::kPut, {how + "-big2"}, {big.src[0]}, kBig);
    lease_back("second store");
    CHECK(!st[0].ok() && st[0].message() == kReason, "%s: the second store: '%s'", how.c_str(),
          st[0].message().c_str());
    st = process_batch(c, proto::Op::kPut, {chunk[0]}, {small.src[0]}, kSmall);
    lease_back("store through the buffer");
    CHECK(st[0].ok(), "%s: a store through the buffer after: %s", how.c_str(), st[0].message().c_str());
  }
  const std::string stats = adp::testing::gateway_stats(c);
  const double want_failures = how == "post" ? 0 : 3;  // the two stores and the chunk
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
  run(dir, "read");
  return adp::testing::finish("store_reader_fail_test");
}
