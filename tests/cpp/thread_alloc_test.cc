// SPDX-License-Identifier: Apache-2.0
// A helper thread whose start fails for want of memory (std::bad_alloc from
// std::thread's own allocation of its state, before any clone) is done
// without, as one that fails with std::system_error is (a1eda4c, 2e31a25,
// tests/store/test_no_thread.py): the CRC worker computes the CRC on the
// caller's thread, a tmpfs card's prefault is skipped, a client segment is
// left to its loads and recovery walks with the threads it got (part
// "store"). The gateway refuses only the connection whose entry, control
// block or thread it cannot make, and serves the next (part "gateway"). A
// Connector whose worker or deadline thread cannot be started fails its
// construction with the reason, the threads it started joined (part
// "connector"); a RemoteBackend whose start-up connect or background
// reconnect has no thread (or no memory on the start-up connect's thread)
// goes on without it (part "remote"). The failure is injected by this program's operator
// new: the next allocation made on the calling thread throws (or the one
// after a given count), or the one after a given count on the thread of a
// given name (the gateway's accept thread, a session's start-up connect).
//
// A gateway whose accept thread cannot be started returns the reason from its start (part "gateway"); an exception
// on a connection's thread ends that connection only, all it held given back (part "connection", session 25).
//
// A connector's worker whose session throws (its start-up connect, a batch, or any allocation on the worker's
// thread) fails the batch it holds with the reason and goes on (part "worker", session 26); the background
// reconnect counts an exception as a failed attempt and goes on (part "reconnect", session 26). The deadline
// thread waits out an allocation failure of a batch's time-out: the future still fails "timed out" (part
// "deadline", session 27). Close() and ~Connector throw nothing: each allocation of either failed in turn with
// batches pending, every future still completes once, failed "connector closed" (part "close", session 28). An
// exception on a
// connection's store reader fails that store with the reason, the reader and the connection go on (part "reader").
//
// Where memory stays out (session 30: each failure followed by every later allocation on that thread, or 8 more on a
// connector's worker) the reason still reaches the client and the log: a connection refused at accept gets its
// Error frame (part "gateway"), a connection that failed its ERROR line and Error frame (part "connection"), a
// RemoteBackend's batch the gateway's reason (part "remote"), a worker's failed batch "out of memory" (part "worker").
//
//   thread_alloc_test TMPFS_DIR
//   [store|gateway|gateway_stop|connection|reader|connector|worker|no_session|deadline|close|remote|reconnect|sweep]
//   (store by default)
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "alloc_fault.h"
#include "check.h"
#include "connector/connector.h"
#include "page_state.h"
#include "protocol/client_segment.h"
#include "raw_client.h"
#include "store/card_device.h"
#include "store/card_store.h"
#include "store/recovery.h"
#include "test_card.h"
#include "test_gateway.h"
#include "transport/remote_backend.h"
#include "util/crc32c.h"
#include "util/crc_worker.h"
#include "util/piece_pool.h"

using adp::testing::fail_after;

namespace {
// The same for the thread named `named_thread` (at most 15 characters; ending in '*': any whose name starts so, such as
// "adp-conn-*", every connection's thread), whichever it is: set by the test's thread
// (named_thread first), counted down by that one. -1: none throws; exchange(-1) disarms and tells whether the
// failure was injected (then it is -1 already).
std::atomic<int> named_fail_after{-1};
const char* named_thread = "";
// Set by the test with named_fail_after: once that failure is injected, the next named_fail_then allocations on the
// named thread fail too (kStaysOut: every later one, memory that stays out, until the test clears named_failing).
// Reaches what a single failure does not: the allocations of a catch's own handling (a log line's arguments, the
// reason's text). named_failing: those still to fail, set at the first failure.
constexpr int kStaysOut = INT32_MAX;
std::atomic<int> named_fail_then{0}, named_failing{0};

bool on_named_thread() {
  char name[17] = {};
  ::prctl(PR_GET_NAME, name, 0, 0, 0);
  const size_t n = std::strlen(named_thread);
  if (n && named_thread[n - 1] == '*') return std::strncmp(name, named_thread, n - 1) == 0;  // a prefix
  return std::strcmp(name, named_thread) == 0;
}

// Whether this allocation is the one to throw (the named thread's count taken down by one otherwise).
// Allocations inside a card store's operation are left alone: an exception out of one ends the gateway on purpose
// (adp::card_store_unwound: the store is not exception-safe), as it did before session 25.
bool named_failure_due() {
  int failing = named_failing.load(std::memory_order_acquire);
  if ((failing == 0 && named_fail_after.load(std::memory_order_acquire) < 0) || !on_named_thread()) return false;
  if (adp::card_store_calls_on_this_thread() > 0) return false;
  while (failing > 0 && !named_failing.compare_exchange_weak(failing, failing == kStaysOut ? kStaysOut : failing - 1)) {
  }
  if (failing > 0) return true;
  int k = named_fail_after.load(std::memory_order_acquire);
  while (k >= 0 && !named_fail_after.compare_exchange_weak(k, k == 0 ? -1 : k - 1)) {
  }
  if (k == 0) named_failing.store(named_fail_then.load(std::memory_order_acquire), std::memory_order_release);
  return k == 0;
}
}  // namespace

// This program's operator new (alloc_fault.h): fail_after, then the named thread's failures.
bool adp::testing::alloc_fault_due() { return named_failure_due(); }

namespace {

using adp::proto::ClientSegment;
using adp::proto::SegmentPrefaulter;

// A file at `path` of `bytes` (sparse), an 'x' written at offset 0 and a 'y' at `y_at` where not 0 (a CHECK on
// failure).
void written_file(const std::string& path, off_t bytes, off_t y_at = 0) {
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, bytes) == 0 && ::pwrite(fd, "x", 1, 0) == 1 &&
            (!y_at || ::pwrite(fd, "y", 1, y_at) == 1),
        "create %s", path.c_str());
  if (fd >= 0) ::close(fd);
}

// start_copy's first allocation is its thread's state: it throws.
void crc_on_the_callers_thread() {
  const std::vector<uint8_t> data = adp::testing::pattern(2 << 20, 7);
  std::vector<uint8_t> copy(data.size());
  adp::CrcWorker w;
  fail_after = 0;
  try {
    w.start_copy(copy.data(), data.data(), data.size());
  } catch (const std::bad_alloc&) {
    CHECK(false, "CrcWorker::start_copy threw std::bad_alloc");
    return;
  }
  CHECK(fail_after == -1, "start_copy allocated nothing: no failure injected");
  fail_after = -1;
  CHECK(w.wait() == adp::crc32c(data.data(), data.size()), "the CRC");
  CHECK(copy == data, "the copy");
}

void prefault_skipped(const std::string& dir) {
  const std::string path = dir + "/thread-alloc.img";
  written_file(path, 16 << 20);
  std::unique_ptr<adp::CardDevice> dev;
  adp::Status s = adp::CardDevice::Open(path, 0, &dev);
  CHECK(s.ok() && dev->mapped(), "open %s mapped: %s", path.c_str(), s.message().c_str());
  if (s.ok() && dev->mapped()) {
    fail_after = 0;
    try {
      dev->start_prefault();
    } catch (const std::bad_alloc&) {
      CHECK(false, "CardDevice::start_prefault threw std::bad_alloc");
    }
    CHECK(fail_after == -1, "start_prefault allocated nothing: no failure injected");
    fail_after = -1;
    CHECK(adp::testing::threads_named("adp-prefault") == 0 && !dev->prefault_done(), "a prefault started");
    CHECK(dev->mapped()[0] == 'x', "the mapped byte");
  }
  dev.reset();
  ::unlink(path.c_str());
}

// The gateway's segment prefaulter (2e31a25): the segment is left to its loads, and a later registration of it
// starts the thread and populates it.
void segment_left_to_its_loads(const std::string& dir) {
  const std::string path = dir + "/thread-alloc-segment";
  written_file(path, 1 << 20);
  std::unique_ptr<ClientSegment> seg;
  adp::Status s = ClientSegment::Attach(::open(path.c_str(), O_RDWR | O_CLOEXEC), 1 << 20, &seg);
  CHECK(s.ok(), "attach %s: %s", path.c_str(), s.message().c_str());
  if (s.ok()) {
    SegmentPrefaulter pre;
    fail_after = 0;
    try {
      pre.add(*seg);
    } catch (const std::bad_alloc&) {
      CHECK(false, "SegmentPrefaulter::add threw std::bad_alloc");
    }
    CHECK(fail_after == -1, "SegmentPrefaulter::add allocated nothing: no failure injected");
    fail_after = -1;
    CHECK(pre.segments_done() == 0 && seg->data()[0] == 'x', "the segment after a failed start");
    pre.add(*seg);  // registered again: the thread starts now
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pre.segments_done() == 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(pre.segments_done() == 1, "a later registration did not populate the segment");
  }
  seg.reset();
  ::unlink(path.c_str());
}

// Recovery's scan of a card of 8 regions (all zeros: nothing found) with 4 threads asked for: its allocations on
// the calling thread are the scans (1), the pool (1), then each thread's state. `let` 2: the first thread's state
// throws (the old code failed the scan); 3: the second's, after one started (the old code ended the process:
// std::terminate, a joinable thread destroyed).
void recovery_without_a_thread(const std::string& dir, int let) {
  const std::string path = dir + "/thread-alloc-recovery.img";
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, 9 << 20) == 0, "create %s", path.c_str());
  if (fd >= 0) ::close(fd);
  std::unique_ptr<adp::CardDevice> dev;
  adp::Status s = adp::CardDevice::Open(path, 0, &dev);
  CHECK(s.ok(), "open %s: %s", path.c_str(), s.message().c_str());
  if (s.ok()) {
    const adp::CardGeometry g{1, 1 << 20, 1 << 20, 8};
    std::vector<adp::RegionScan> scans;
    fail_after = let;
    try {
      s = adp::scan_regions(*dev, g, 4, &scans);
      CHECK(s.ok() && scans.size() == 8, "scan (let %d): %s, %zu scans", let, s.message().c_str(), scans.size());
    } catch (const std::bad_alloc&) {
      CHECK(false, "scan_regions (let %d) threw std::bad_alloc", let);
    }
    CHECK(fail_after == -1, "scan_regions (let %d): no failure injected", let);
    fail_after = -1;
  }
  dev.reset();
  ::unlink(path.c_str());
}

// Session 29 (gwstop29 item 3): each allocation on the card's prefault thread (adp-prefault: the walk's window) failed
// in turn: the process lives (ERROR, loads fault the pages in), the card's bytes as they were. The old code:
// std::terminate on that thread (nothing caught there), the gateway gone at its card's open.
void card_prefault_out_of_memory(const std::string& dir) {
  const std::string path = dir + "/prefault-oom.img";
  written_file(path, 16 << 20, 8 << 20);
  named_thread = "adp-prefault";
  int k = 0, failed = 0;
  for (; k < 50; k++) {
    std::unique_ptr<adp::CardDevice> dev;
    if (!adp::CardDevice::Open(path, 0, &dev).ok() || !dev->mapped()) break;
    named_fail_after.store(k, std::memory_order_release);
    dev->start_prefault();
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (named_fail_after.load() >= 0 && !dev->prefault_done() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool injected = named_fail_after.exchange(-1) < 0;
    CHECK(dev->mapped()[0] == 'x' && dev->mapped()[8 << 20] == 'y', "let %d: the mapped bytes", k);
    if (!injected) {
      CHECK(dev->prefault_done(), "no failure injected (let %d), and the prefault did not finish", k);
      break;
    }
    dev.reset();  // joins it: ended by the exception
    failed++;
  }
  CHECK(failed >= 1 && k < 50, "%d allocations on the card's prefault thread failed", failed);
  std::printf("store: %d allocations on the card's prefault thread failed: the process lives\n", failed);
  ::unlink(path.c_str());
}

// The same for a segment's background populate (adp-segpopulate: its file's name, the walk): each failure leaves the
// segment to its loads and lets go of it (a later registration populates it), the thread goes on.
void segment_populate_out_of_memory(const std::string& dir) {
  const std::string path = dir + "/populate-oom-segment";
  written_file(path, 1 << 20);
  named_thread = "adp-segpopulate";
  int k = 0, failed = 0;
  for (; k < 50; k++) {
    std::unique_ptr<ClientSegment> seg;
    if (!ClientSegment::Attach(::open(path.c_str(), O_RDWR | O_CLOEXEC), 1 << 20, &seg).ok()) break;
    SegmentPrefaulter pre;
    named_fail_after.store(k, std::memory_order_release);
    pre.add(*seg);
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (pre.pending() != 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool injected = named_fail_after.exchange(-1) < 0;
    CHECK(pre.pending() == 0, "let %d: the populate did not end within 10 s", k);
    if (!injected) {
      CHECK(pre.segments_done() == 1, "no failure injected (let %d), and the segment was not populated", k);
      break;
    }
    failed++;
    CHECK(pre.segments_done() == 0 && seg->data()[0] == 'x', "let %d: the segment after the failure", k);
    pre.add(*seg);  // let go of: queued again, on the same thread
    give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (pre.segments_done() == 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(pre.segments_done() == 1, "let %d: a later registration did not populate the segment", k);
  }
  CHECK(failed >= 1 && k < 50, "%d allocations of a segment's populate failed", failed);
  std::printf("store: %d allocations of a segment's background populate failed: the thread went on\n", failed);
  ::unlink(path.c_str());
}

// The same for recovery's scan threads (adp-recover: a region's records), 2 of them on a card of 3 objects: the open
// fails "out of memory for recovery" (or, for an allocation it does without, finds every object).
void recovery_scan_out_of_memory(const std::string& dir) {
  const std::string path = dir + "/recover-oom.img";
  adp::CardOptions o = adp::testing::card_options(1u << 20, path, adp::testing::card_bytes(8, 1u << 20));
  o.recovery_threads = 2;
  const std::vector<uint8_t> v = adp::testing::pattern(100000, 9);
  {
    std::unique_ptr<adp::CardStore> store;
    CHECK(adp::CardStore::Open(o, &store).ok(), "create %s", path.c_str());
    if (!store) return;
    adp::IoContext ctx;
    for (const char* key : {"oom/a", "oom/b", "oom/c"}) {
      adp::PutItem item{key, v.data(), v.size()};
      adp::Status st;
      store->put(ctx, &item, 1, &st, [] { return true; });
      CHECK(st.ok(), "put %s: %s", key, st.message().c_str());
    }
  }
  o.create_bytes = 0;
  named_thread = "adp-recover";
  int k = 0, failed = 0;
  for (; k < 100; k++) {
    named_fail_after.store(k, std::memory_order_release);
    std::unique_ptr<adp::CardStore> store;
    const adp::Status s = adp::CardStore::Open(o, &store);
    const bool injected = named_fail_after.exchange(-1) < 0;
    if (!s.ok()) {
      CHECK(injected && s.message().ends_with(": out of memory for recovery"), "let %d: the open: %s", k,
            s.message().c_str());
      failed++;
    } else {
      CHECK(store->stats().objects == 3, "let %d: %llu objects found", k,
            static_cast<unsigned long long>(store->stats().objects));
    }
    if (!injected) break;
  }
  CHECK(failed >= 1 && k < 100, "%d opens failed of the allocations let 0..%d on the scan threads", failed, k);
  std::printf("store: %d allocations on recovery's scan threads failed: the open failed with the reason\n", failed);
  ::unlink(path.c_str());
}

// The frame a new connection gets for a Hello (no ring: payload inline), its type (-1: none), the Error's text in
// *reason; the named injection disarmed once it came, *injected: whether it had been consumed by then (before the
// connection is closed: its end wakes the accept thread).
int hello_reply(const std::string& socket, std::string* reason, bool* injected) {
  adp::proto::Endpoint ep;
  adp::proto::parse_endpoint("unix://" + socket, &ep);
  int fd = -1;
  int type = -1;
  if (adp::proto::connect_endpoint(ep, adp::testing::in_seconds(10), &fd).ok()) {
    std::vector<uint8_t> body;
    adp::proto::Hello hello;
    hello.client_name = "thread-alloc";
    adp::proto::encode_hello(hello, &body);
    adp::proto::write_frame(fd, adp::proto::FrameType::kHello, 1, body, {}, adp::testing::in_seconds(10));
    adp::proto::Frame f;
    if (adp::proto::read_frame(fd, 1 << 20, adp::testing::in_seconds(10), &f).ok()) {
      type = f.header.type;
      std::string_view r;
      if (type == uint8_t(adp::proto::FrameType::kError) && adp::proto::decode_error(f.body, &r).ok())
        reason->assign(r);
    }
  }
  *injected = named_fail_after.exchange(-1) < 0;
  named_failing.store(0, std::memory_order_release);  // memory back once the answer came
  if (fd >= 0) ::close(fd);
  return type;
}

// accept_one's allocations on the accept thread, each failed in turn (the new connection's entry, its control
// block, its thread's state; the count of those connected allocates only at the bound): that connection is refused
// with the reason and counted, the next one is served. The old code let them out of the accept loop (std::terminate:
// the gateway gone for every client) but for std::system_error at the thread's start.
// stays_out (session 30, accepterr30): every allocation on the accept thread after the failed one fails too, until
// the client read its answer: the refusal's Error frame still goes (before, its text and body were allocated: the
// connection was closed without it, the client read a closed socket).
void gateway_refuses_only_that_connection(const std::string& dir, bool stays_out) {
  const adp::GatewayOptions go = adp::testing::gateway_options(dir, 16, 0, stays_out ? "-alloc-out" : "-alloc");
  std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
  if (!gw) return;
  named_thread = "adp-gw-accept";
  named_fail_then.store(stays_out ? kStaysOut : 0, std::memory_order_release);
  const int kHelloOk = uint8_t(adp::proto::FrameType::kHelloOk), kError = uint8_t(adp::proto::FrameType::kError);
  int refused = 0, k = 0;
  for (; k < 32; k++) {
    named_fail_after.store(k, std::memory_order_release);
    std::string reason;
    bool injected = false;
    const int a = hello_reply(go.socket_path, &reason, &injected);
    if (!injected) {  // accept_one made fewer than k + 1 allocations: each has been failed
      CHECK(a == kHelloOk, "no failure injected (let %d), and no HelloOk: %d %s", k, a, reason.c_str());
      break;
    }
    CHECK(a == kError &&
              reason == "the gateway cannot start a thread for this connection (out of memory: std::bad_alloc)",
          "allocation %d at accept failed: frame %d, '%s'", k, a, reason.c_str());
    refused++;
    const double counted = adp::testing::stat(gw->stats_json(), "refused_connections");
    CHECK(counted == refused, "refused_connections %g after %d refused", counted, refused);
    std::string next_reason;
    bool next_injected = false;
    const int b = hello_reply(go.socket_path, &next_reason, &next_injected);
    CHECK(b == kHelloOk, "allocation %d at accept failed: the next connection got %d '%s'", k, b, next_reason.c_str());
  }
  // Its entry, its control block and its thread's state at least: fewer, and the injection missed them.
  named_fail_then.store(0, std::memory_order_release);
  CHECK(refused >= 3 && k < 32, "%d allocations at accept failed (let 0..%d)", refused, k);
  std::printf("gateway: %d allocations at accept failed%s, each connection refused, the next served\n", refused,
              stays_out ? ", each with every one after it" : "");
  adp::testing::stop_gateway(*gw);
}

// GatewayServer::Start whose accept thread cannot be started (ADP_TEST_ACCEPT_THREAD_FAIL: std::system_error as
// under a pids limit, std::bad_alloc for its state): Start returns the reason (the old code threw out of it), the
// socket file is removed, no piece helper is left and the card is closed (a gateway starts on it next).
void gateway_start_fails_with_the_reason(const std::string& dir) {
  for (const std::string how : {"system", "alloc"}) {
    const adp::GatewayOptions go = adp::testing::gateway_options(dir, 16, 2, "-start-" + how);
    ::setenv("ADP_TEST_ACCEPT_THREAD_FAIL", how.c_str(), 1);
    std::unique_ptr<adp::GatewayServer> gw;
    adp::Status s;
    try {
      s = adp::GatewayServer::Start(go, &gw);
    } catch (const std::exception& e) {
      CHECK(false, "%s: GatewayServer::Start threw %s", how.c_str(), e.what());
      s = adp::Status::IoError("threw");
    }
    ::unsetenv("ADP_TEST_ACCEPT_THREAD_FAIL");
    const std::string want = std::string("the gateway cannot start its accept thread (") +
                             (how == "alloc" ? "out of memory: std::bad_alloc" : std::strerror(EAGAIN)) + ")";
    CHECK(!s.ok() && s.message() == want && !gw, "%s: Start: '%s', want '%s'", how.c_str(), s.message().c_str(),
          want.c_str());
    CHECK(::access(go.socket_path.c_str(), F_OK) != 0, "%s: the socket file of the failed start is left", how.c_str());
    for (int i = 0; i < 2; i++)
      CHECK(adp::testing::threads_named_after_join("adp-gw-piece-" + std::to_string(i)) == 0,
            "%s: piece helper %d left running", how.c_str(), i);
    adp::GatewayOptions again = go;
    again.card.create_bytes = 0;
    std::unique_ptr<adp::GatewayServer> next = adp::testing::start_gateway(again);  // the card's lock was given back
    if (next) {
      std::string reason;
      bool injected = false;
      const int a = hello_reply(again.socket_path, &reason, &injected);
      CHECK(a == uint8_t(adp::proto::FrameType::kHelloOk), "%s: the gateway started after: %d '%s'", how.c_str(), a,
            reason.c_str());
      adp::testing::stop_gateway(*next);
    }
  }
  std::printf("gateway: a start whose accept thread failed returned the reason, its card closed\n");
}

// One client's session, quietly (no CHECK: a connection the gateway ends is what the sweep below makes): a ring
// and process memory (Hello, RegisterProcess), a process put of `objs`, their get, a Stats request. True when all
// went as it should; *error: the Error frame's text where one came in place of a reply.
bool quiet_session(const std::string& socket, adp::testing::ProcessObjects& objs, std::string* error) {
  namespace proto = adp::proto;
  using adp::testing::in_seconds;
  proto::Endpoint ep;
  proto::parse_endpoint("unix://" + socket, &ep);
  adp::testing::RawClient c;
  if (!proto::connect_endpoint(ep, in_seconds(10), &c.fd).ok() || !proto::SharedRing::Create(4 << 20, &c.ring).ok())
    return false;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{c.fd};
  proto::Frame f;
  // The next frame, of type `want`; an Error's text in *error.
  auto reply = [&](proto::FrameType want) {
    if (!proto::read_frame(c.fd, 1 << 20, in_seconds(10), &f).ok()) return false;
    std::string_view r;
    if (f.header.type == uint8_t(proto::FrameType::kError) && proto::decode_error(f.body, &r).ok()) error->assign(r);
    return f.header.type == uint8_t(want);
  };
  std::vector<uint8_t> body;
  proto::Hello hello;
  hello.features = proto::kFeatureRing | proto::kFeatureProcessLoads | proto::kFeatureProcessStores;
  hello.ring_bytes = c.ring->size();
  hello.client_name = "thread-alloc";
  proto::encode_hello(hello, &body);
  proto::write_frame(c.fd, proto::FrameType::kHello, ++c.rid, body, {}, in_seconds(10), c.ring->fd());
  if (!reply(proto::FrameType::kHelloOk)) return false;
  for (size_t i = 0; i < sizeof c.probe; i++) c.probe[i] = uint8_t(i * 7 + 3);
  proto::RegisterProcess reg;
  reg.pid = static_cast<uint32_t>(::getpid());
  reg.probe_addr = reinterpret_cast<uintptr_t>(c.probe);
  reg.probe = c.probe;
  body.clear();
  proto::encode_register_process(reg, &body);
  proto::write_frame(c.fd, proto::FrameType::kRegisterProcess, ++c.rid, body, {}, in_seconds(10));
  proto::ProcessOk ok;
  if (!reply(proto::FrameType::kProcessOk) || !proto::decode_process_ok(f.body, &ok).ok() ||
      !(ok.features & proto::kFeatureProcessStores))
    return false;
  std::vector<std::string> keys;
  for (size_t i = 0; i < objs.src.size(); i++) keys.push_back("conn-" + std::to_string(i));
  for (const proto::Op op : {proto::Op::kPut, proto::Op::kGet}) {
    const uint64_t rid = ++c.rid;
    __atomic_store_n(reinterpret_cast<uint64_t*>(c.ring->data()), proto::lease_word(rid, proto::kLeaseOpen),
                     __ATOMIC_RELEASE);
    proto::BatchRequest req;
    req.op = op;
    req.timeout_ms = 10000;
    const std::vector<uint8_t*>& bufs = op == proto::Op::kPut ? objs.src : objs.dst;
    for (size_t i = 0; i < keys.size(); i++)
      req.items.push_back({keys[i], objs.size, reinterpret_cast<uintptr_t>(bufs[i]), proto::kProcessSegment});
    body.clear();
    proto::encode_batch(req, &body);
    proto::write_frame(c.fd, proto::FrameType::kBatch, rid, body, {}, in_seconds(10));
    proto::BatchReply r;
    if (!reply(proto::FrameType::kBatchReply) || !proto::decode_batch_reply(f.body, &r).ok()) return false;
    for (const auto& item : r.results)
      if (!item.status.ok()) return false;
  }
  for (size_t i = 0; i < objs.dst.size(); i++)
    if (std::memcmp(objs.dst[i], objs.want[i].data(), objs.size) != 0) return false;
  proto::write_frame(c.fd, proto::FrameType::kStats, ++c.rid, {}, {}, in_seconds(10));
  return reply(proto::FrameType::kStatsReply);
}

// Each allocation on a connection's thread (adp-conn-N: its handshake, process registration, a put and a get of
// process memory, a Stats request, its teardown) failed in turn: that connection ends (the Error "the gateway failed
// serving this connection (out of memory: std::bad_alloc)" where it still reads), failed_connections counts it,
// everything it held is given back (clients, ring bytes mapped and in use, processes, store buffers, load holds,
// piece callers, the open connections the accept thread counts) and the next connection is served. The old code
// had no catch on the connection's thread: std::terminate, the gateway gone for every client.
// stays_out (session 30, accepterr30): every allocation on that thread after the failed one fails too, until the
// connection ended: each session the failure ended is told why all the same (its Error frame made in place), where
// the old code's ERROR line (its peer's text) and the frame's body threw, the frame never sent: the client read a
// closed connection, the log "its end could not be logged (out of memory)".
void gateway_ends_only_that_connection(const std::string& dir, bool stays_out) {
  adp::GatewayOptions go = adp::testing::gateway_options(dir, 64, 2, stays_out ? "-conn-out" : "-conn");
  std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
  if (!gw) return;
  adp::testing::ProcessObjects objs(2, 96 << 10);
  named_thread = "adp-conn-*";
  named_fail_then.store(stays_out ? kStaysOut : 0, std::memory_order_release);
  const char* kReason = "the gateway failed serving this connection (out of memory: std::bad_alloc)";
  int failed = 0, ended_sessions = 0, with_reason = 0, k = 0;
  for (; k < 3000; k++) {
    for (uint8_t* d : objs.dst) std::memset(d, 0, objs.size);
    named_fail_after.store(k, std::memory_order_release);
    std::string error;
    const bool ok = quiet_session(go.socket_path, objs, &error);
    // The connection's end: its thread is past its teardown once the accept thread no longer counts it.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (gw->clients() != 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool injected = named_fail_after.exchange(-1) < 0;
    named_failing.store(0, std::memory_order_release);  // memory back for the next session
    const std::string st = gw->stats_json();
    if (!injected) {  // every allocation of the session has been failed
      CHECK(ok, "no failure injected (let %d), and the session failed: '%s'", k, error.c_str());
      break;
    }
    // Ended by the exception: counted once. One thrown after the session's last reply (its teardown's, say) is
    // counted with the session served; one a request turned into its status (no memory for it) ends none.
    const double counted = adp::testing::stat(st, "failed_connections");
    const int ended = static_cast<int>(counted) - failed;
    CHECK(ended == 0 || ended == 1, "let %d: failed_connections %g after %d", k, counted, failed);
    CHECK(ok || ended == 1 || !error.empty(), "let %d: the session failed, with no Error, and no connection failed", k);
    CHECK(error.empty() || error == kReason || ended == 0, "let %d: the Error '%s'", k, error.c_str());
    CHECK(!stays_out || ok || ended == 0 || error == kReason, "let %d: a session the failure ended not told why: '%s'",
          k, error.c_str());
    failed = static_cast<int>(counted);
    if (!ok && ended == 1) ended_sessions++;
    with_reason += !ok && error == kReason;
    for (const char* key : {"clients", "ring_bytes", "ring_used_bytes", "segments", "processes", "store_buffer_bytes",
                            "load_hold_bytes", "store_buffer_waiting", "process_piece_callers"})
      CHECK(adp::testing::stat(st, key) == 0, "let %d: %s %g after the connection ended", k, key,
            adp::testing::stat(st, key));
    CHECK(gw->clients() == 0, "let %d: %zu connections still counted", k, gw->clients());
    std::string next_error;
    CHECK(quiet_session(go.socket_path, objs, &next_error), "let %d: the next connection was not served: '%s'", k,
          next_error.c_str());
    while (gw->clients() != 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  named_fail_then.store(0, std::memory_order_release);
  CHECK(ended_sessions >= 20 && with_reason >= 10 && k < 3000,
        "%d sessions ended by a failed connection (%d told why) of the allocations let 0..%d", ended_sessions,
        with_reason, k);
  std::printf(
      "gateway: %d allocations on a connection's thread failed%s: %d connections failed (%d sessions ended, "
      "%d told why), each given back, the next served\n",
      k, stays_out ? ", each with every one after it" : "", failed, ended_sessions, with_reason);
  adp::testing::stop_gateway(*gw);
}

// A status query's connection (Hello with kFeatureStatusQuery, HelloOk read), left open; -1 where none was made.
int connect_status_query(const std::string& socket) {
  namespace proto = adp::proto;
  proto::Endpoint ep;
  proto::parse_endpoint("unix://" + socket, &ep);
  int fd = -1;
  if (!proto::connect_endpoint(ep, adp::testing::in_seconds(10), &fd).ok()) return -1;
  std::vector<uint8_t> body;
  proto::Hello hello;
  hello.features = proto::kFeatureStatusQuery;
  hello.client_name = "thread-alloc status";
  proto::encode_hello(hello, &body);
  proto::write_frame(fd, proto::FrameType::kHello, 1, body, {}, adp::testing::in_seconds(10));
  proto::Frame f;
  if (!proto::read_frame(fd, 1 << 20, adp::testing::in_seconds(10), &f).ok() ||
      f.header.type != uint8_t(proto::FrameType::kHelloOk)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Session 29 (gwstop29 item 1): each allocation of a gateway's stop on its accept thread (the stopping line's count,
// the prefaulter's stop, the connections' reaping, the count line of those gone, the card's close and its pad)
// failed in turn, with a client connected (an object stored), a status query connected and a connection in its
// handshake: stop() finishes (wait), the socket file is removed, and the card is closed: it opens again (its lock
// given back) and the object reads back. Then each allocation of ~GatewayServer on the calling thread, the same. The
// old code: std::terminate (the stopping line's ", 1 more in their handshake" made outside any try on the accept
// thread), the card left as a crash leaves it.
void gateway_stops_without_memory(const std::string& dir) {
  adp::GatewayOptions go = adp::testing::gateway_options(dir, 16, 2, "-stop");  // with piece helpers
  go.handshake_timeout_ms = 600000;  // the connection in its handshake is there at the stop
  adp::testing::ProcessObjects objs(1, 64 << 10);
  for (const bool destructor : {false, true}) {
    named_thread = "adp-gw-accept";
    int k = 0;
    for (; k < 200; k++) {
      std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
      go.card.create_bytes = 0;  // reopened from here on
      if (!gw) return;
      const std::string key = std::string(destructor ? "dtor-" : "stop-") + std::to_string(k);
      adp::testing::RawClient client;
      if (!adp::testing::connect_process_store_client(go.socket_path, "thread-alloc stop", &client)) return;
      const std::vector<adp::Status> put =
          adp::testing::process_batch(client, adp::proto::Op::kPut, {key}, {objs.src[0]}, objs.size);
      CHECK(put[0].ok(), "let %d: the store before the stop: %s", k, put[0].message().c_str());
      const int query = connect_status_query(go.socket_path);
      CHECK(query >= 0, "let %d: no status query connected", k);
      adp::proto::Endpoint ep;
      adp::proto::parse_endpoint("unix://" + go.socket_path, &ep);
      int half = -1;  // connected, no Hello: in its handshake
      CHECK(adp::proto::connect_endpoint(ep, adp::testing::in_seconds(10), &half).ok(), "let %d: connect", k);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (gw->clients() != 2 && std::chrono::steady_clock::now() < give_up)  // the client and the handshake
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      CHECK(gw->clients() == 2, "let %d: %zu connections counted, not the client and the handshake", k, gw->clients());
      bool injected = false, stopped = false;
      if (destructor) {
        fail_after = k;
        gw.reset();  // noexcept: stops, joins the accept thread and closes the card
        injected = fail_after == -1;
        fail_after = -1;
        stopped = true;
      } else {
        named_fail_after.store(k, std::memory_order_release);
        gw->stop();
        stopped = gw->wait(std::chrono::seconds(30));
        injected = named_fail_after.exchange(-1) < 0;
        CHECK(stopped, "let %d: stop() did not finish within 30 s", k);
      }
      CHECK(::access(go.socket_path.c_str(), F_OK) != 0, "let %d: the socket file is left after the stop", k);
      gw.reset();
      for (int fd : {client.fd, query, half})
        if (fd >= 0) ::close(fd);
      // The card closed: its lock given back (this open would fail on it), the object stored before the stop read.
      std::unique_ptr<adp::CardStore> store;
      adp::Status s = adp::CardStore::Open(go.card, &store);
      CHECK(s.ok(), "let %d: the card after the stop: %s", k, s.message().c_str());
      if (!s.ok()) return;
      {
        adp::IoContext ctx;
        std::vector<uint8_t> got;
        s = store->get(ctx, key, [&](size_t size, const adp::CopyFn& copy) {
          got.assign(size, 0);
          return copy(got.data());
        });
        CHECK(s.ok() && got == objs.want[0], "let %d: %s after the reopen: %s", k, key.c_str(), s.message().c_str());
      }
      store.reset();
      if (!stopped || !injected) break;  // every allocation of the stop has been failed
    }
    // ~GatewayServer on the calling thread: none may be made (k 0) or each be failed; the stop's several at least.
    CHECK(k >= (destructor ? 0 : 1) && k < 200, "%s: %d allocations failed", destructor ? "~GatewayServer" : "the stop",
          k);
    std::printf(
        "gateway stop: %d allocations of %s failed in turn: each stopped, its socket removed, its card closed and "
        "read back\n",
        k, destructor ? "~GatewayServer" : "the accept thread's stop");
  }
}

class NullSession : public adp::BackendSession {
 public:
  void put(const adp::PutItem*, size_t n, adp::Status* results, adp::Deadline, const adp::GuardedReadFn&) override {
    for (size_t i = 0; i < n; i++) results[i] = adp::Status::Ok();
  }
  void get(const std::string_view*, const size_t*, uint8_t* const*, size_t n, adp::Status* results, adp::Deadline,
           const adp::DeliverFn&, const adp::GuardedReadFn&) override {
    for (size_t i = 0; i < n; i++) results[i] = adp::Status::NotFound("null");
  }
  void exists(const std::string_view*, size_t n, adp::Status* results, adp::Deadline) override {
    for (size_t i = 0; i < n; i++) results[i] = adp::Status::NotFound("null");
  }
  void remove(const std::string_view*, size_t n, adp::Status* results, adp::Deadline) override {
    for (size_t i = 0; i < n; i++) results[i] = adp::Status::NotFound("null");
  }
};

class NullBackend : public adp::Backend {
 public:
  std::unique_ptr<adp::BackendSession> new_session() override { return std::make_unique<NullSession>(); }
  std::string describe() const override { return "null backend"; }
  adp::StoreStats stats() const override { return {}; }
};

// The Connector's constructor, each of its allocations on the calling thread failed in turn: it throws (a
// runtime_error naming the thread that could not be started, or bad_alloc before any), leaving no thread behind.
// The old code ended the process at the second worker's state (the first one joinable in the unwinding).
void connector_fails_with_the_reason() {
  constexpr int kWorkers = 3;
  int failed = 0, k = 0;
  bool worker = false, deadline = false;
  {
    // One made first: what is read once and kept (the CPUs' text, its cgroup files read) is not counted below, so
    // every construction of the sweep makes the same allocations.
    adp::ConnectorOptions opts;
    opts.num_workers = kWorkers;
    adp::Connector warm(std::make_unique<NullBackend>(), opts);
  }
  for (; k < 1000; k++) {
    auto backend = std::make_unique<NullBackend>();
    adp::ConnectorOptions opts;
    opts.num_workers = kWorkers;
    opts.timeout_ms = 1000;
    std::unique_ptr<adp::Connector> c;
    std::string error;
    fail_after = k;
    try {
      c = std::make_unique<adp::Connector>(std::move(backend), opts);
    } catch (const std::runtime_error& e) {
      error = e.what();
    } catch (const std::bad_alloc&) {
      error = "std::bad_alloc";
    }
    const bool injected = fail_after == -1;
    fail_after = -1;
    if (!injected) {
      CHECK(c != nullptr, "no failure injected (let %d), and no connector: %s", k, error.c_str());
      break;
    }
    if (c) continue;  // a failure the constructor did without
    failed++;
    worker = worker || error == "ADPConnector: cannot start its worker thread 2 of 3 (out of memory: std::bad_alloc)";
    deadline = deadline || error == "ADPConnector: cannot start its deadline thread (out of memory: std::bad_alloc)";
    CHECK(error == "std::bad_alloc" || error.starts_with("ADPConnector: cannot start its "), "let %d: %s", k,
          error.c_str());
    for (int i = 0; i < kWorkers; i++)
      CHECK(adp::testing::threads_named_after_join("adp-worker-" + std::to_string(i)) == 0,
            "let %d: adp-worker-%d left running", k, i);
    CHECK(adp::testing::threads_named_after_join("adp-deadline") == 0, "let %d: adp-deadline left running", k);
  }
  CHECK(worker && deadline && k < 1000, "no failed start of the second worker (%d) or the deadline thread (%d)", worker,
        deadline);
  std::printf("connector: %d allocations of its construction failed, each a clean failure\n", failed);
}

// A session whose start-up connect throws (a test double: RemoteSession's does not).
class ThrowingPrepareSession : public NullSession {
 public:
  void prepare() override { throw std::runtime_error("prepare failed for the test"); }
};

class ThrowingPrepareBackend : public NullBackend {
 public:
  std::unique_ptr<adp::BackendSession> new_session() override { return std::make_unique<ThrowingPrepareSession>(); }
};

// Future `id`'s completion (drained from c), waiting up to 10 s; none: ok false, error "no completion".
adp::Completion completion_of(adp::Connector& c, uint64_t id) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < give_up) {
    for (adp::Completion& got : c.drain())
      if (got.future_id == id) return got;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return {id, false, "no completion", {}};
}

// One batch of `op` on two keys of 64 bytes each (buffers of `mem`), its completion.
adp::Completion one_batch(adp::Connector& c, adp::OpType op, std::vector<uint8_t>& mem) {
  mem.assign(128, 7);
  const uint64_t id = c.submit(op, {"a", "b"}, {{mem.data(), 64}, {mem.data() + 64, 64}}, nullptr);
  return completion_of(c, id);
}

// Session 26: a worker's session->prepare() that throws (outside any try: std::terminate, the LMCache server gone)
// is logged, and the worker serves its batches.
void worker_goes_on_after_a_throwing_prepare() {
  adp::ConnectorOptions opts;
  opts.num_workers = 1;
  opts.timeout_ms = 5000;
  adp::Connector c(std::make_unique<ThrowingPrepareBackend>(), opts);
  std::vector<uint8_t> mem;
  const adp::Completion got = one_batch(c, adp::OpType::kSet, mem);
  CHECK(got.ok && got.per_key == std::vector<uint8_t>({1, 1}), "the store after a throwing prepare: %d '%s'", got.ok,
        got.error.c_str());
  std::printf("connector: a worker whose session's prepare threw served its batch\n");
}

// Session 26: each allocation on a connector's worker thread (adp-worker-0: taking the slice, running it, the
// session's, its completion) failed in turn, for a store and a load: each future completes (ok, or failed with
// "the connector's worker failed this batch (out of memory: std::bad_alloc)"), the next batch is served. The old
// code: std::terminate at the first allocation outside run_task's try (the slice's vector).
// then (session 30, accepterr30): each failure followed by `then` more on that thread (the 8 of session 29's run,
// memory out long enough for the reason's text and short of the completion's retries): a failed batch still gets the
// reason, where the old code's text failed too and the batch completed "the connector failed this batch (no memory
// for the reason)".
void worker_goes_on_after_an_exception(int then) {
  adp::ConnectorOptions opts;
  opts.num_workers = 1;
  opts.timeout_ms = 10000;
  adp::Connector c(std::make_unique<NullBackend>(), opts);
  std::vector<uint8_t> mem;
  const std::string kReason = "the connector's worker failed this batch (out of memory: std::bad_alloc)";
  named_thread = "adp-worker-0";
  named_fail_then.store(then, std::memory_order_release);
  int k = 0, failed = 0;
  for (; k < 500; k++) {
    named_fail_after.store(k, std::memory_order_release);
    const adp::Completion put = one_batch(c, adp::OpType::kSet, mem);
    const adp::Completion get = one_batch(c, adp::OpType::kGet, mem);
    const bool injected = named_fail_after.exchange(-1) < 0;  // disarmed: the next batch has no failure
    named_failing.store(0, std::memory_order_release);
    const adp::Completion next = one_batch(c, adp::OpType::kSet, mem);
    for (const adp::Completion* got : {&put, &get})
      CHECK(got->ok || got->error == kReason, "let %d: a batch's completion: %d '%s'", k, got->ok, got->error.c_str());
    CHECK(put.ok || put.per_key == std::vector<uint8_t>({0, 0}), "let %d: a failed store read as stored", k);
    failed += !put.ok + !get.ok;
    CHECK(next.ok && next.per_key == std::vector<uint8_t>({1, 1}), "let %d: the batch after: %d '%s'", k, next.ok,
          next.error.c_str());
    if (!injected) break;  // every allocation of the two batches has been failed
  }
  named_fail_then.store(0, std::memory_order_release);
  CHECK(failed >= 5 && k > 0 && k < 500, "%d batches failed of the allocations let 0..%d", failed, k);
  CHECK(adp::testing::threads_named("adp-worker-0") == 1, "the worker thread is gone");
  std::printf(
      "connector: %d allocations on a worker's thread failed%s: %d batches failed with the reason, the next "
      "served\n",
      k, then ? (", each with " + std::to_string(then) + " after it").c_str() : "", failed);
}

// How a SessionlessBackend's next session fails: 0 it is made; 1 std::runtime_error; 2 std::bad_alloc, with the
// next 8 allocations on adp-worker-0 failing too (memory that stays out while the batch is failed: its text, its
// ERROR line, the completion's first tries).
std::atomic<int> session_failure{0};

class SessionlessBackend : public NullBackend {
 public:
  std::unique_ptr<adp::BackendSession> new_session() override {
    switch (session_failure.load()) {
      case 1:
        throw std::runtime_error("no session for the test");
      case 2:
        named_failing.store(8, std::memory_order_release);  // named_thread: adp-worker-0, set by the test
        throw std::bad_alloc();
    }
    return NullBackend::new_session();
  }
};

// Session 31 (brief start31 task 3): a batch of a worker that has no backend session failed "worker has no backend
// session", the reason the session could not be made only in the (rate-limited) ERROR line. Now the batch keeps it,
// made with no allocation: "worker has no backend session (no session for the test)", and with memory out "(out of
// memory: std::bad_alloc)". The next batch, once a session can be made, is served.
void worker_without_a_session_keeps_the_reason() {
  adp::ConnectorOptions opts;
  opts.num_workers = 1;
  opts.timeout_ms = 10000;
  session_failure = 1;
  adp::Connector c(std::make_unique<SessionlessBackend>(), opts);  // its start-up session fails too
  std::vector<uint8_t> mem;
  const adp::Completion plain = one_batch(c, adp::OpType::kSet, mem);
  CHECK(!plain.ok && plain.error == "worker has no backend session (no session for the test)",
        "a batch without a session: %d '%s'", plain.ok, plain.error.c_str());
  named_thread = "adp-worker-0";
  session_failure = 2;
  const adp::Completion memory = one_batch(c, adp::OpType::kGet, mem);
  named_failing.store(0, std::memory_order_release);
  CHECK(!memory.ok && memory.error == "worker has no backend session (out of memory: std::bad_alloc)",
        "a batch without a session, memory out: %d '%s'", memory.ok, memory.error.c_str());
  session_failure = 0;
  const adp::Completion next = one_batch(c, adp::OpType::kSet, mem);
  CHECK(next.ok && next.per_key == std::vector<uint8_t>({1, 1}), "the batch once a session is made: %d '%s'", next.ok,
        next.error.c_str());
  std::printf("connector: batches of a worker without a session failed with the reason ('%s', '%s'), the next served\n",
              plain.error.c_str(), memory.error.c_str());
}

// While set, a HeldSession's stores wait (their batches time out first); cleared, they are served.
std::atomic<bool> held_puts{false};

class HeldSession : public NullSession {
 public:
  void put(const adp::PutItem* items, size_t n, adp::Status* results, adp::Deadline deadline,
           const adp::GuardedReadFn& read) override {
    while (held_puts.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    NullSession::put(items, n, results, deadline, read);
  }
};

class HeldBackend : public NullBackend {
 public:
  std::unique_ptr<adp::BackendSession> new_session() override { return std::make_unique<HeldSession>(); }
};

// Session 27: each allocation on the connector's deadline thread (adp-deadline: a batch's time-out, its completion
// and its retirement) failed in turn: the batch's future still completes, failed "timed out after 1000 ms" with no
// key stored, the deadline thread goes on (the next iteration's batch times out the same way) and a batch the
// worker serves in time completes ok. The old code: std::terminate (publish_locked's allocations on the deadline
// thread, outside any try).
void deadline_goes_on_after_an_exception() {
  adp::ConnectorOptions opts;
  opts.num_workers = 1;
  opts.timeout_ms = 1000;  // the served batch's margin (a NullSession's store takes microseconds)
  adp::Connector c(std::make_unique<HeldBackend>(), opts);
  std::vector<uint8_t> mem;
  const std::string kTimedOut = "timed out after 1000 ms";
  named_thread = "adp-deadline";
  int k = 0;
  for (; k < 100; k++) {
    held_puts = true;
    named_fail_after.store(k, std::memory_order_release);
    const adp::Completion late = one_batch(c, adp::OpType::kSet, mem);
    const bool injected = named_fail_after.exchange(-1) < 0;
    held_puts = false;
    CHECK(!late.ok && late.error == kTimedOut && late.per_key == std::vector<uint8_t>({0, 0}),
          "let %d: the batch that timed out: %d '%s'", k, late.ok, late.error.c_str());
    const adp::Completion next = one_batch(c, adp::OpType::kSet, mem);  // behind the held one: the worker's FIFO
    CHECK(next.ok && next.per_key == std::vector<uint8_t>({1, 1}), "let %d: the batch after: %d '%s'", k, next.ok,
          next.error.c_str());
    if (!injected) break;  // every allocation of a time-out has been failed
  }
  CHECK(k >= 2 && k < 100, "%d allocations of a time-out failed", k);
  CHECK(adp::testing::threads_named("adp-deadline") == 1, "the deadline thread is gone");
  std::printf(
      "connector: %d allocations on the deadline thread failed: each batch timed out all the same, the next "
      "served\n",
      k);
}

// A backend whose sessions' stores wait until the connector's close() interrupts it (then fail): batches stay
// pending until close(), whichever worker holds one.
class BlockingBackend : public NullBackend {
 public:
  class Session : public NullSession {
   public:
    explicit Session(const std::atomic<bool>* interrupted) : interrupted_(interrupted) {}
    void put(const adp::PutItem*, size_t n, adp::Status* results, adp::Deadline, const adp::GuardedReadFn&) override {
      while (!interrupted_->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      for (size_t i = 0; i < n; i++) results[i] = adp::Status::Closed("interrupted");
    }

   private:
    const std::atomic<bool>* interrupted_;
  };
  std::unique_ptr<adp::BackendSession> new_session() override { return std::make_unique<Session>(&interrupted_); }
  void interrupt() override { interrupted_ = true; }

 private:
  std::atomic<bool> interrupted_{false};
};

// Session 28: each allocation of close() (on the calling thread) with three store batches pending failed in turn,
// then each of ~Connector's (close() not called first): the process lives, close() throws nothing, and after it one
// drain() has every batch's completion, once each, failed "connector closed" with no key stored (one whose
// completion close() had no memory for is completed all the same; the drain makes it). The old code: close() threw
// std::bad_alloc out of failing the pending batches, its threads left running, and ~Connector ended the process
// (std::terminate).
void close_fails_every_pending_batch() {
  adp::ConnectorOptions opts;
  opts.num_workers = 2;
  opts.timeout_ms = 600000;  // no batch times out before close()
  const std::vector<uint8_t> none(2, 0);
  for (const bool destructor : {false, true}) {
    int k = 0;
    for (; k < 200; k++) {
      auto c = std::make_unique<adp::Connector>(std::make_unique<BlockingBackend>(), opts);
      std::vector<uint8_t> mem(3 * 128, 7);
      std::vector<uint64_t> ids;
      for (int i = 0; i < 3; i++) {
        uint8_t* m = mem.data() + 128 * i;
        const std::string p = "b" + std::to_string(i) + "/";
        ids.push_back(c->submit(adp::OpType::kSet, {p + "a", p + "b"}, {{m, 64}, {m + 64, 64}}, nullptr));
      }
      fail_after = k;
      if (destructor) {
        c.reset();  // noexcept: an exception out of it is std::terminate
      } else {
        try {
          c->close();
        } catch (...) {
          CHECK(false, "let %d: close() threw", k);
        }
      }
      const bool injected = fail_after == -1;
      fail_after = -1;
      if (!destructor) {
        std::vector<adp::Completion> got;
        try {
          got = c->drain();
        } catch (const std::bad_alloc&) {
          CHECK(false, "let %d: the drain after close() threw std::bad_alloc", k);
        }
        for (const uint64_t id : ids) {
          int seen = 0;
          for (const adp::Completion& g : got) {
            if (g.future_id != id) continue;
            seen++;
            CHECK(!g.ok && g.error == "connector closed" && g.per_key == none,
                  "let %d: future %" PRIu64 " after close(): %d '%s'", k, id, g.ok, g.error.c_str());
          }
          CHECK(seen == 1, "let %d: future %" PRIu64 " completed %d times by close() and a drain", k, id, seen);
        }
        CHECK(got.size() == ids.size(), "let %d: %zu completions for %zu futures", k, got.size(), ids.size());
        CHECK(c->drain().empty(), "let %d: a second drain found more", k);
        c.reset();
      }
      if (!injected) break;  // every allocation of close() (or ~Connector) has been failed
    }
    CHECK(k >= 3 && k < 200, "%s: %d allocations failed", destructor ? "~Connector" : "close()", k);
    std::printf("connector: %d allocations of %s with 3 batches pending failed: the process lives%s\n", k,
                destructor ? "~Connector" : "close()",
                destructor ? "" : ", every future completed once, failed 'connector closed'");
  }
}

// A batch's buffer owner that counts its destruction (the release of the caller's buffers).
struct CountedOwner : adp::BufferOwner {
  explicit CountedOwner(int* freed) : freed(freed) {}
  ~CountedOwner() override { ++*freed; }
  int* freed;
};

// Session 29 (gwstop29 item 2): each allocation of Connector::submit() failed in turn, on an open connector and
// after close(): a submit that throws std::bad_alloc (Python: MemoryError) has freed its batch by then (its owner
// destroyed: the caller's buffers released, never written) and no completion ever comes for it; one that returns
// completes once (stored on the open connector; failed "connector is closed" after close()). The old code: after
// close(), a submit without memory for the completion kept the batch (live, its deadline queued) until ~Connector.
void submit_refused_without_memory() {
  adp::ConnectorOptions opts;
  opts.num_workers = 2;
  opts.timeout_ms = 600000;
  for (const bool closed : {true, false}) {
    auto c = std::make_unique<adp::Connector>(std::make_unique<NullBackend>(), opts);
    if (closed) c->close();
    std::vector<uint8_t> mem(128, 7);
    int k = 0, refused = 0;
    for (; k < 100; k++) {
      int freed = 0;
      std::vector<std::string> keys = {"s/a", "s/b"};
      std::vector<adp::Buffer> bufs = {{mem.data(), 64}, {mem.data() + 64, 64}};
      auto owner = std::make_unique<CountedOwner>(&freed);
      uint64_t id = 0;
      bool threw = false;
      fail_after = k;
      try {
        id = c->submit(adp::OpType::kSet, std::move(keys), std::move(bufs), std::move(owner));
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      const bool injected = fail_after == -1;
      fail_after = -1;
      if (threw) {
        refused++;
        CHECK(freed == 1, "%s, let %d: the refused batch's owner freed %d times at the throw",
              closed ? "closed" : "open", k, freed);
      } else {
        const adp::Completion got = completion_of(*c, id);
        const bool want =
            closed ? !got.ok && got.error == "connector is closed" && got.per_key == std::vector<uint8_t>(2, 0)
                   : got.ok && got.per_key == std::vector<uint8_t>(2, 1);
        CHECK(want, "%s, let %d: the batch: %d '%s'", closed ? "closed" : "open", k, got.ok, got.error.c_str());
      }
      CHECK(c->drain().empty(), "%s, let %d: a completion for a refused batch or a second one",
            closed ? "closed" : "open", k);
      c->free_retired();
      CHECK(freed == 1, "%s, let %d: the batch's owner freed %d times once drained", closed ? "closed" : "open", k,
            freed);
      if (!injected) break;  // every allocation of submit() has been failed
    }
    CHECK(refused >= 2 && k < 100, "%s: %d submits refused of the allocations let 0..%d", closed ? "closed" : "open",
          refused, k);
    std::printf("connector: %d allocations of submit() %s failed: %d refused, each batch freed at once\n", k,
                closed ? "after close()" : "on an open connector", refused);
  }
}

// Session 28 (gwexc28 item 2): each allocation of ~CardStore (the frontier's pad at a clean close: its list, the
// copy pad_cuts makes) failed in turn after a store: the process lives, and the next open (which pads the tail as a
// crash's cut) reads the object back and stores another. The old code: std::terminate (out of the destructor).
void card_store_close_throws_nothing(const std::string& dir) {
  const std::string path = dir + "/close-pad.img";
  adp::CardOptions o = adp::testing::card_options(1u << 20, path, adp::testing::card_bytes(8, 1u << 20));
  o.recovery_threads = 1;
  const std::vector<uint8_t> v = adp::testing::pattern(20000, 3), w = adp::testing::pattern(30000, 4);
  int k = 0;
  for (; k < 50; k++) {
    ::unlink(path.c_str());
    std::unique_ptr<adp::CardStore> store;
    adp::Status s = adp::CardStore::Open(o, &store);
    CHECK(s.ok(), "let %d: open: %s", k, s.message().c_str());
    if (!s.ok()) return;
    {
      adp::IoContext ctx;
      adp::PutItem item{"pad/a", v.data(), v.size()};
      store->put(ctx, &item, 1, &s, [] { return true; });
      CHECK(s.ok(), "let %d: put: %s", k, s.message().c_str());
    }
    fail_after = k;
    store.reset();  // noexcept: an exception out of it is std::terminate
    const bool injected = fail_after == -1;
    fail_after = -1;
    s = adp::CardStore::Open(o, &store);
    CHECK(s.ok(), "let %d: reopen: %s", k, s.message().c_str());
    if (!s.ok()) return;
    adp::IoContext ctx;
    std::vector<uint8_t> got;
    s = store->get(ctx, "pad/a", [&](size_t size, const adp::CopyFn& copy) {
      got.assign(size, 0);
      return copy(got.data());
    });
    CHECK(s.ok() && got == v, "let %d: the object after the reopen: %s", k, s.message().c_str());
    adp::PutItem item{"pad/b", w.data(), w.size()};
    store->put(ctx, &item, 1, &s, [] { return true; });
    CHECK(s.ok(), "let %d: a put after the reopen: %s", k, s.message().c_str());
    store.reset();
    if (!injected) break;
  }
  CHECK(k >= 1 && k < 50, "%d allocations of ~CardStore failed", k);
  std::printf("card store: %d allocations of ~CardStore failed: the process lives, the next open reads the object\n",
              k);
  ::unlink(path.c_str());
}

adp::GatewayClientOptions nowhere(const std::string& dir) {
  adp::GatewayClientOptions o;
  adp::proto::parse_endpoint("unix://" + dir + "/no-gateway.sock", &o.endpoint);
  o.client_name = "thread-alloc";
  return o;
}

// A batch's status for one key against no gateway (the session connects on its own).
adp::Status exists_one(adp::BackendSession& s) {
  const std::string_view key = "k";
  adp::Status st;
  s.exists(&key, 1, &st, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  return st;
}

// RemoteSession::prepare: its thread's state fails, the first batch connects on its own (the old code caught only
// std::system_error: bad_alloc went out of prepare, past the worker's loop: std::terminate).
void start_connect_without_a_thread(const std::string& dir) {
  adp::RemoteBackend rb(nowhere(dir));
  std::unique_ptr<adp::BackendSession> s = rb.new_session();
  fail_after = 0;
  try {
    s->prepare();
  } catch (const std::bad_alloc&) {
    CHECK(false, "RemoteSession::prepare threw std::bad_alloc");
  }
  CHECK(fail_after == -1, "prepare allocated nothing: no failure injected");
  fail_after = -1;
  CHECK(adp::testing::threads_named("adp-connect") == 0, "a start-up connect thread");
  const adp::Status st = exists_one(*s);
  CHECK(st.code() == adp::Status::Code::kUnavailable, "the batch after: %s", st.message().c_str());
}

// Session 28 (gwexc28 item 2): destructors that allocate nothing, each run with the next allocation on this thread
// set to fail (armed): the injection is still armed afterwards. ~SegmentPrefaulter with its thread started: the old
// code's stop() swapped its queue into a new std::deque, whose map it allocated (std::terminate here). An IoContext
// that served a store and a load, a mapped CardDevice whose prefault ran, a GatewayClient-less RemoteSession and its
// RemoteBackend after an outage (their drops' log lines are caught: each of their allocations failed in turn, the
// process lives).
void destructors_allocate_nothing(const std::string& dir) {
  auto armed_reset = [](const char* what, auto& p) {
    fail_after = 0;
    p.reset();
    CHECK(fail_after == 0, "%s allocated", what);
    fail_after = -1;
  };
  {
    const std::string path = dir + "/dtor-segment";
    int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    CHECK(fd >= 0 && ::ftruncate(fd, 1 << 20) == 0, "create %s", path.c_str());
    if (fd >= 0) ::close(fd);
    std::unique_ptr<ClientSegment> seg;
    CHECK(ClientSegment::Attach(::open(path.c_str(), O_RDWR | O_CLOEXEC), 1 << 20, &seg).ok(), "attach");
    auto pre = std::make_unique<SegmentPrefaulter>();
    if (seg) pre->add(*seg);  // its thread started
    armed_reset("~SegmentPrefaulter", pre);
    seg.reset();
    ::unlink(path.c_str());
  }
  {
    const std::string path = dir + "/dtor-card.img";
    adp::CardOptions o = adp::testing::card_options(1u << 20, path, adp::testing::card_bytes(8, 1u << 20));
    o.recovery_threads = 1;
    std::unique_ptr<adp::CardStore> store;
    CHECK(adp::CardStore::Open(o, &store).ok(), "open %s", path.c_str());
    if (store) {
      auto ctx = std::make_unique<adp::IoContext>();
      const std::vector<uint8_t> v = adp::testing::pattern(100000, 5);
      adp::PutItem item{"dtor/a", v.data(), v.size()};
      adp::Status st;
      store->put(*ctx, &item, 1, &st, [] { return true; });
      std::vector<uint8_t> got;
      st = store->get(*ctx, "dtor/a", [&](size_t size, const adp::CopyFn& copy) {
        got.assign(size, 0);
        return copy(got.data());
      });
      CHECK(st.ok() && got == v, "the load before ~IoContext: %s", st.message().c_str());
      armed_reset("~IoContext", ctx);
      store.reset();
    }
    std::unique_ptr<adp::CardDevice> dev;
    CHECK(adp::CardDevice::Open(path, 0, &dev).ok() && dev->mapped(), "open the device of %s mapped", path.c_str());
    if (dev) {
      dev->start_prefault();
      armed_reset("~CardDevice", dev);
    }
    ::unlink(path.c_str());
  }
  int k = 0;
  for (; k < 200; k++) {
    auto rb = std::make_unique<adp::RemoteBackend>(nowhere(dir));
    std::unique_ptr<adp::BackendSession> s = rb->new_session();
    const adp::Status st = exists_one(*s);  // an outage: the background reconnect started
    CHECK(st.code() == adp::Status::Code::kUnavailable, "the batch: %s", st.message().c_str());
    fail_after = k;
    s.reset();
    rb.reset();
    const bool injected = fail_after == -1;
    fail_after = -1;
    if (!injected) break;
  }
  CHECK(k < 200, "~RemoteSession and ~RemoteBackend: %d allocations failed", k);
  std::printf(
      "destructors: ~SegmentPrefaulter, ~IoContext and ~CardDevice allocate nothing; %d allocations of ~RemoteSession "
      "and ~RemoteBackend failed: the process lives\n",
      k);
}

// The start-up connect's thread, each of its allocations failed in turn (the connect's, then the background
// reconnect's thread's state, started by the outage it notes): no exception leaves it (the old code: std::terminate
// at the first), and the batch after gets the outage.
// sticky (session 29, allocinfo29): every allocation after the failed one fails too, the catch's own line's among
// them (its DEBUG line's connector description: this part logs at DEBUG).
void start_connect_out_of_memory(const std::string& dir, bool sticky) {
  named_thread = "adp-connect";
  named_fail_then.store(sticky ? kStaysOut : 0, std::memory_order_release);
  int k = 0;
  for (; k < 1000; k++) {
    adp::RemoteBackend rb(nowhere(dir));
    std::unique_ptr<adp::BackendSession> s = rb.new_session();
    named_fail_after.store(k, std::memory_order_release);
    s->prepare();
    const adp::Status st = exists_one(*s);  // waits for the start-up connect's outcome
    s.reset();                              // joins its thread
    const bool injected = named_fail_after.exchange(-1) < 0;
    named_failing.store(0, std::memory_order_release);
    CHECK(st.code() == adp::Status::Code::kUnavailable, "let %d: the batch after: %s", k, st.message().c_str());
    if (!injected) break;
  }
  named_fail_then.store(0, std::memory_order_release);
  CHECK(k > 0 && k < 1000, "%d allocations on the start-up connect's thread failed", k);
  std::printf("remote: %d allocations on the start-up connect's thread failed%s, none left it\n", k,
              sticky ? ", each with every one after it" : "");
}

// Session 30 (accepterr30): the connector's side of a connection the gateway fails for want of memory that stays out
// (each allocation on the connection's thread, adp-conn-*, failed in turn with every one after it, until the batch
// returned): a RemoteBackend's lookup of one key, on a connection of its own, fails with the gateway's reason (its
// Error frame: "gateway refused: the gateway failed serving this connection (out of memory: std::bad_alloc)", the
// outage's WARN line says it too). The old code: the frame was never sent, the batch failed "connection closed" and
// the connector logged the gateway as gone ("connection closed; its requests fail until it is back").
void remote_told_why(const std::string& dir) {
  const adp::GatewayOptions go = adp::testing::gateway_options(dir, 16, 0, "-told");
  std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
  if (!gw) return;
  adp::GatewayClientOptions o;
  adp::proto::parse_endpoint("unix://" + go.socket_path, &o.endpoint);
  o.client_name = "thread-alloc";
  const std::string kReason = "the gateway failed serving this connection (out of memory: std::bad_alloc)";
  named_thread = "adp-conn-*";
  named_fail_then.store(kStaysOut, std::memory_order_release);
  int k = 0, failed = 0;
  for (; k < 1000; k++) {
    adp::RemoteBackend rb(o);
    std::unique_ptr<adp::BackendSession> s = rb.new_session();
    named_fail_after.store(k, std::memory_order_release);
    const adp::Status st = exists_one(*s);
    s.reset();
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (gw->clients() != 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool injected = named_fail_after.exchange(-1) < 0;
    named_failing.store(0, std::memory_order_release);
    if (!injected) {
      CHECK(st.code() == adp::Status::Code::kNotFound, "no failure injected (let %d): %s", k, st.message().c_str());
      break;
    }
    if (st.ok() || st.is_not_found()) continue;  // a failure the connection did without, or after the reply
    failed++;
    CHECK(st.message().find(kReason) != std::string::npos, "let %d: the lookup failed without the reason: '%s'", k,
          st.message().c_str());
  }
  named_fail_then.store(0, std::memory_order_release);
  CHECK(failed >= 5 && k < 1000, "%d lookups failed of the allocations let 0..%d", failed, k);
  std::printf(
      "remote: %d allocations on the gateway's connection thread failed, each with every one after it: %d "
      "lookups failed with the gateway's reason\n",
      k, failed);
  adp::testing::stop_gateway(*gw);
}

// A batch's connect failing (no gateway) starts the background reconnect (note_down): each allocation of the batch
// failed in turn, one of them the reconnect thread's state, which is done without (the batch gets the outage, no
// reconnect thread); the old code caught only std::system_error and let bad_alloc out of the batch.
void reconnect_without_a_thread(const std::string& dir) {
  int k = 0, without = 0;
  for (; k < 1000; k++) {
    adp::RemoteBackend rb(nowhere(dir));
    std::unique_ptr<adp::BackendSession> s = rb.new_session();
    adp::Status st;
    bool threw = false;
    fail_after = k;
    try {
      st = exists_one(*s);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    const bool injected = fail_after == -1;
    fail_after = -1;
    if (!injected) {
      CHECK(!threw && st.code() == adp::Status::Code::kUnavailable, "let %d: %s", k, st.message().c_str());
      break;
    }
    if (!threw && !rb.stats().gateway_reachable && adp::testing::threads_named_after_join("adp-reconnect") == 0) {
      CHECK(st.code() == adp::Status::Code::kUnavailable, "let %d: %s", k, st.message().c_str());
      without++;
    }
  }
  CHECK(without >= 1 && k < 1000, "no batch went on without its background reconnect thread (let 0..%d)", k);
  std::printf("remote: %d failed allocations of a batch's outage were done without its reconnect thread\n", without);
}

// Session 26: each allocation on the background reconnect's thread (adp-reconnect, started by a batch's outage)
// failed in turn while no gateway answers at the connector's socket: the attempt counts as failed (logged, back-off)
// and the thread goes on: once a gateway answers there (a link made to one's socket), it connects by itself
// (gateway_reachable, no batch). The old code: std::terminate at the first (nothing caught in reconnect_loop).
void reconnect_goes_on_after_an_exception(const std::string& dir) {
  const adp::GatewayOptions go = adp::testing::gateway_options(dir, 16, 0, "-reconnect");
  std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
  if (!gw) return;
  const std::string link = dir + "/reconnect-link.sock";
  adp::GatewayClientOptions o;
  adp::proto::parse_endpoint("unix://" + link, &o.endpoint);
  o.client_name = "thread-alloc";
  ::setenv("ADP_TEST_MAX_BACKOFF_MS", "20", 1);  // read at the RemoteBackend's construction
  named_thread = "adp-reconnect";
  constexpr int kAllocations = 60;  // each attempt allocates: more than one attempt's are swept
  int k = 0;
  for (; k < kAllocations; k++) {
    ::unlink(link.c_str());
    adp::RemoteBackend rb(o);
    std::unique_ptr<adp::BackendSession> s = rb.new_session();
    named_fail_after.store(k, std::memory_order_release);
    const adp::Status st = exists_one(*s);  // the outage: the reconnect thread starts
    CHECK(st.code() == adp::Status::Code::kUnavailable, "let %d: the batch: %s", k, st.message().c_str());
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (named_fail_after.load() >= 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool injected = named_fail_after.exchange(-1) < 0;
    CHECK(injected, "let %d: no allocation failed on the reconnect thread within 10 s", k);
    CHECK(::symlink(go.socket_path.c_str(), link.c_str()) == 0, "symlink %s", link.c_str());
    give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!rb.stats().gateway_reachable && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    CHECK(rb.stats().gateway_reachable, "let %d: the background reconnect did not connect after the exception", k);
    CHECK(adp::testing::threads_named("adp-reconnect") == 1, "let %d: the reconnect thread is gone", k);
    s.reset();
  }
  ::unlink(link.c_str());
  ::unsetenv("ADP_TEST_MAX_BACKOFF_MS");
  std::printf("remote: %d allocations on the reconnect thread failed, each a failed attempt, then connected\n", k);
  adp::testing::stop_gateway(*gw);
}

// Session 26: each allocation on a connection's store reader (adp-gw-sread-*: a pipelined store's read of a 9 MiB
// object from the client's memory, under the lease, with the piece helpers) failed in turn: that store is answered
// "out of memory: the gateway failed reading this object from the client's memory (std::bad_alloc)" (or stored, for
// an allocation whose failure the read does without), store_reader_failures counts it, the lease and every count
// are given back (the next store and load on the connection are served: a lease left held would stall them), and
// no connection fails. The old code: std::terminate (nothing caught on the reader's thread).
void reader_goes_on_after_an_exception(const std::string& dir) {
  namespace proto = adp::proto;
  ::setenv("ADP_TEST_GATEWAY_CPUS", "4", 1);  // a spare CPU for the reader on any host: the store is pipelined
  const adp::GatewayOptions go = adp::testing::gateway_options(dir, 128, 2, "-reader");
  std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
  ::unsetenv("ADP_TEST_GATEWAY_CPUS");
  if (!gw) return;
  adp::testing::RawClient c;
  adp::testing::ProcessObjects objs(1, (9 << 20) + 4099);  // >= 8 MiB: pipelined
  if (!adp::testing::connect_process_store_client(go.socket_path, "thread-alloc reader", &c) || !objs.ok()) return;
  const std::string kReason =
      "out of memory: the gateway failed reading this object from the client's memory (std::bad_alloc)";
  named_thread = "adp-gw-sread-*";
  int k = 0, failures = 0;
  for (; k < 500; k++) {
    const std::string key = "reader-" + std::to_string(k);
    named_fail_after.store(k, std::memory_order_release);
    std::vector<adp::Status> st = adp::testing::process_batch(c, proto::Op::kPut, {key}, {objs.src[0]}, objs.size);
    const bool injected = named_fail_after.exchange(-1) < 0;
    // The lease given back (session 27): a real client's revoke would wait on one left held.
    CHECK(adp::testing::lease_given_back(c), "let %d: the store's lease word %#llx", k,
          static_cast<unsigned long long>(adp::testing::lease_word_now(c)));
    if (!injected) {
      CHECK(st[0].ok(), "no failure injected (let %d), and the store failed: %s", k, st[0].message().c_str());
      break;
    }
    CHECK(st[0].ok() || st[0].message() == kReason, "let %d: the store: %s", k, st[0].message().c_str());
    const bool stored = st[0].ok();
    failures += !stored;
    std::memset(objs.dst[0], 0, objs.size);
    st = adp::testing::process_batch(c, proto::Op::kGet, {key}, {objs.dst[0]}, objs.size);
    CHECK(stored ? st[0].ok() && std::memcmp(objs.dst[0], objs.want[0].data(), objs.size) == 0 : st[0].is_not_found(),
          "let %d: the load after (stored %d): %s", k, stored, st[0].message().c_str());
    // The reader goes on: the next store (pipelined again) and its load are served.
    st = adp::testing::process_batch(c, proto::Op::kPut, {key + "-next"}, {objs.src[0]}, objs.size);
    CHECK(st[0].ok(), "let %d: the store after: %s", k, st[0].message().c_str());
    const std::string stats = adp::testing::gateway_stats(c);
    CHECK(adp::testing::stat(stats, "store_reader_failures") == failures, "let %d: store_reader_failures %g, want %d",
          k, adp::testing::stat(stats, "store_reader_failures"), failures);
    // (process_piece_callers is not 0 here: the connection is live, a loader counted until it idles 20 ms.)
    for (const char* key_name : {"failed_connections", "store_buffer_waiting"})
      CHECK(adp::testing::stat(stats, key_name) == 0, "let %d: %s %g", k, key_name,
            adp::testing::stat(stats, key_name));
  }
  const double pipelined = adp::testing::stat(adp::testing::gateway_stats(c), "process_store_pipelined");
  CHECK(failures >= 3 && k < 500 && pipelined >= 1, "%d stores failed of the allocations let 0..%d (%g pipelined)",
        failures, k, pipelined);
  std::printf(
      "gateway: %d allocations on a store reader failed: %d stores failed with the reason, the connection "
      "and its reader went on\n",
      k, failures);
  ::close(c.fd);
  adp::testing::stop_gateway(*gw);
}

// The gateway's piece helpers (PiecePool), each allocation of the pool's start failed in turn: the pool goes on
// with the helpers started and runs every piece (the old code threw out of the constructor, or ended the process
// once a helper had started: std::terminate).
void piece_pool_with_the_helpers_it_got() {
  constexpr int kHelpers = 3;
  int k = 0;
  bool some = false;  // a pool with one helper or two
  for (; k < 100; k++) {
    std::unique_ptr<adp::PiecePool> pool;
    fail_after = k;
    try {
      pool = std::make_unique<adp::PiecePool>(kHelpers, 2, 64);
    } catch (const std::bad_alloc&) {
    }
    const bool injected = fail_after == -1;
    fail_after = -1;
    if (!injected) {
      CHECK(pool && pool->threads() == kHelpers, "no failure injected (let %d), and no pool of %d", k, kHelpers);
      break;
    }
    if (k == 0) continue;  // the pool itself
    CHECK(pool != nullptr, "let %d: PiecePool threw std::bad_alloc", k);
    if (!pool) continue;
    some = some || (pool->threads() > 0 && pool->threads() < kHelpers);
    std::atomic<int> ran{0};
    const bool ok = pool->run(64, [&](size_t, int) {
      ran++;
      return true;
    });
    CHECK(ok && ran == 64, "let %d: %d of 64 pieces ran with %d helpers", k, ran.load(), pool->threads());
  }
  CHECK(some && k < 100, "no pool went on with some of its helpers (let 0..%d)", k);
}

// Part "sweep" (session 26): an allocation failure inside a card store operation leaves the store as if the
// operation had failed. A short sequence of store operations (puts of keys of two sizes, one through a fill and two
// in one put_each, loads, a delete, a replacement, puts that evict) runs on a new card once for each allocation it
// makes on this thread, that allocation failing (std::bad_alloc), the store's own and the test's alike: an
// operation then fails (a Status or the exception), and afterwards, with no failure injected, every key reads one
// of the values stored under it or a miss (never other bytes), none of its deletes is refused (no store left in
// flight), a put of each key is stored and read back, a card's worth more is stored (evicting), the store's counts
// match what reads find, and a reopen finds the same: every key of a value stored under it or missing, and after
// every key is deleted no byte is counted used (no capacity lost). Since session 27 every key is deleted right after
// the faulted sequence and the card reopened: each must be a miss (deletes stick, docs/card_format.md). A hang (a
// ticket never resolved, a pin or a load's entry left behind) ends the program through the watchdog.
namespace sweep {

constexpr uint64_t kRegion = 1u << 20;
constexpr size_t kSmall = 20000, kBig = 600u << 10;
std::atomic<int64_t> watchdog_deadline{0};  // steady-clock seconds; 0: not armed
std::atomic<int> current_run{0};

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Key {
  std::string name;
  size_t size;
  std::vector<std::vector<uint8_t>> values;  // every value stored under it (any may be what it reads)
};

std::vector<uint8_t> value_of(size_t key, size_t size, int version) {
  return adp::testing::pattern(size, static_cast<uint8_t>(key * 16 + version));
}

// What an operation did: ran (any Status), threw std::bad_alloc, or (the injection still armed afterwards) allocated
// less than the budget left.
struct Injector {
  int budget;  // allocations to let through before one fails; -1: the failure came already
  int thrown = 0;
  template <typename F>
  void op(F f) {
    fail_after = budget;
    try {
      f();
    } catch (const std::bad_alloc&) {
      thrown++;
    }
    budget = fail_after;  // -1 once it failed
    fail_after = -1;
  }
};

adp::Status put_one(adp::CardStore& store, adp::IoContext& ctx, const Key& k, const std::vector<uint8_t>& v,
                    bool fill) {
  adp::PutItem item{k.name, v.data(), v.size()};
  if (fill)
    item = adp::PutItem{k.name, nullptr, v.size(), [&v](uint8_t* dst, uint64_t off, size_t len) {
                          std::memcpy(dst, v.data() + off, len);
                          return adp::Status::Ok();
                        }};
  adp::Status r;
  store.put(ctx, &item, 1, &r, [] { return true; });
  return r;
}

// key's value as a load finds it: Ok (in *out), NotFound, or another failure.
adp::Status read(adp::CardStore& store, adp::IoContext& ctx, const Key& k, std::vector<uint8_t>* out) {
  return store.get(ctx, k.name, [&](size_t size, const adp::CopyFn& copy) {
    out->assign(size, 0);
    return copy(out->data());
  });
}

// Every key reads one of its values or a miss; returns the payload bytes and objects found.
std::pair<uint64_t, uint64_t> check_reads(adp::CardStore& store, adp::IoContext& ctx, const std::vector<Key>& keys,
                                          const char* when, int run) {
  uint64_t bytes = 0, objects = 0;
  std::vector<uint8_t> got;
  for (const Key& k : keys) {
    adp::Status s = read(store, ctx, k, &got);
    if (s.is_not_found()) continue;
    CHECK(s.ok(), "run %d, %s: load of %s: %s", run, when, k.name.c_str(), s.message().c_str());
    if (!s.ok()) continue;
    bool known = false;
    for (const auto& v : k.values) known |= got == v;
    CHECK(known, "run %d, %s: %s read %zu bytes that are none of its values", run, when, k.name.c_str(), got.size());
    bytes += got.size();
    objects++;
  }
  return {bytes, objects};
}

adp::CardOptions options(const std::string& path) {
  adp::CardOptions o;
  o.path = path;
  o.create_bytes = adp::kDataOffset + 8 * kRegion;
  o.region_bytes = kRegion;
  o.recovery_threads = 1;
  return o;
}

// One run: the sequence with allocation number `let` + 1 failing. False once the sequence made fewer allocations
// (the sweep is done).
bool run_once(const std::string& dir, int let) {
  const std::string path = dir + "/sweep.img";
  ::unlink(path.c_str());
  std::unique_ptr<adp::CardStore> store;
  adp::Status s = adp::CardStore::Open(options(path), &store);
  CHECK(s.ok(), "run %d: open: %s", let, s.message().c_str());
  if (!s.ok()) return false;
  watchdog_deadline = now_s() + 60;
  current_run = let;
  auto ctx = std::make_unique<adp::IoContext>();
  // a, c: small; b, the h*: big; d: replaced.
  std::vector<Key> keys;
  const char* names[] = {"sweep/a", "sweep/b", "sweep/c", "sweep/d"};
  for (size_t i = 0; i < 4; i++) keys.push_back({names[i], i % 2 ? kBig : kSmall, {}});
  for (size_t i = 0; i < 12; i++) keys.push_back({"sweep/h" + std::to_string(i), kBig, {}});
  for (size_t i = 0; i < keys.size(); i++)
    for (int v = 1; v <= 3; v++) keys[i].values.push_back(value_of(i, keys[i].size, v));

  Injector inj{let};
  std::vector<uint8_t> got;
  got.reserve(kBig);
  {
    adp::PutItem two[2] = {{keys[0].name, keys[0].values[0].data(), kSmall},
                           {keys[1].name, keys[1].values[0].data(), kBig}};
    adp::Status r[2];
    inj.op([&] { store->put_each(*ctx, two, 2, r, [](size_t) { return true; }); });
  }
  inj.op([&] { put_one(*store, *ctx, keys[2], keys[2].values[0], true); });
  inj.op([&] { put_one(*store, *ctx, keys[3], keys[3].values[0], false); });
  inj.op([&] { read(*store, *ctx, keys[0], &got); });
  inj.op([&] { read(*store, *ctx, keys[1], &got); });
  inj.op([&] { store->remove(*ctx, keys[1].name); });
  inj.op([&] { put_one(*store, *ctx, keys[3], keys[3].values[1], false); });  // replaces d
  for (size_t i = 4; i < keys.size(); i++)  // 12 x 600 KiB on 8 MiB: the last ones evict
    inj.op([&] { put_one(*store, *ctx, keys[i], keys[i].values[0], i % 3 == 0); });
  inj.op([&] { read(*store, *ctx, keys[3], &got); });
  inj.op([&] { store->exists(keys[2].name); });
  const bool injected = inj.budget < 0;
  if (!injected) {
    store.reset();
    ::unlink(path.c_str());
    watchdog_deadline = 0;
    return false;
  }

  // No failure from here on.
  check_reads(*store, *ctx, keys, "after the failure", let);
  for (const Key& k : keys) {
    s = store->remove(*ctx, k.name);
    CHECK(s.ok() || s.is_not_found(), "run %d: delete of %s after the failure: %s", let, k.name.c_str(),
          s.message().c_str());
  }
  // Deletes stick (session 27): every key was just deleted (or missed), the keys whose put failed after its bytes
  // were written and b, deleted during the sequence, among them; none comes back at the next open. Before session
  // 27 a copy left by a put that failed late was never voided and outranked the delete's tombstone (or no delete
  // found it to mark), and a tombstone dropped for want of memory left the older copy to the merge.
  ctx.reset();
  store.reset();
  s = adp::CardStore::Open(options(path), &store);
  CHECK(s.ok(), "run %d: reopen after the deletes: %s", let, s.message().c_str());
  if (!s.ok()) return false;
  ctx = std::make_unique<adp::IoContext>();
  for (const Key& k : keys) {
    s = read(*store, *ctx, k, &got);
    CHECK(s.is_not_found(), "run %d (allocation %d failed): %s, deleted before the reopen, came back after it (%s)",
          let, let + 1, k.name.c_str(), s.ok() ? "a load found it" : s.message().c_str());
  }
  for (size_t i = 0; i < keys.size(); i++) {
    s = put_one(*store, *ctx, keys[i], keys[i].values[2], i % 2 == 0);
    CHECK(s.ok(), "run %d: put of %s after the failure: %s", let, keys[i].name.c_str(), s.message().c_str());
  }
  for (size_t i = keys.size() - 4; i < keys.size(); i++) {  // the last ones stored: not evicted yet
    s = read(*store, *ctx, keys[i], &got);
    CHECK(s.ok() && got == keys[i].values[2], "run %d: %s read back after the failure: %s", let, keys[i].name.c_str(),
          s.message().c_str());
  }
  auto [bytes, objects] = check_reads(*store, *ctx, keys, "after the puts", let);
  adp::StoreStats st = store->stats();
  CHECK(st.payload_bytes == bytes && st.objects == objects,
        "run %d: the store counts %" PRIu64 " objects of %" PRIu64 " bytes; loads found %" PRIu64 " of %" PRIu64, let,
        uint64_t(st.objects), uint64_t(st.payload_bytes), objects, bytes);

  ctx.reset();
  store.reset();
  s = adp::CardStore::Open(options(path), &store);
  CHECK(s.ok(), "run %d: reopen: %s", let, s.message().c_str());
  if (s.ok()) {
    ctx = std::make_unique<adp::IoContext>();
    check_reads(*store, *ctx, keys, "after the reopen", let);
    for (const Key& k : keys) {
      s = store->remove(*ctx, k.name);
      CHECK(s.ok() || s.is_not_found(), "run %d: delete of %s after the reopen: %s", let, k.name.c_str(),
            s.message().c_str());
    }
    st = store->stats();
    CHECK(st.used_bytes == 0 && st.payload_bytes == 0 && st.objects == 0,
          "run %d: after every key was deleted the reopened card counts %" PRIu64 " objects, %" PRIu64
          " bytes used (of the empty card's 0)",
          let, uint64_t(st.objects), uint64_t(st.used_bytes));
  }
  ctx.reset();
  store.reset();
  ::unlink(path.c_str());
  watchdog_deadline = 0;
  return true;
}

void allocation_failure_sweep(const std::string& dir) {
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    while (!done) {
      int64_t d = watchdog_deadline.load();
      if (d && now_s() > d) {
        std::fprintf(stderr, "sweep: run %d (allocation %d failed) hung: no progress in 60 s\n", current_run.load(),
                     current_run.load() + 1);
        std::_Exit(3);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  int runs = 0;
  const int before = adp::testing::check_failures;
  for (int let = 0; run_once(dir, let); let++) {
    runs++;
    if (adp::testing::check_failures - before > 20) break;  // enough to read
  }
  done = true;
  watchdog.join();
  std::printf("sweep: %d allocations of the sequence failed in turn\n", runs);
  CHECK(runs > 50, "the sequence made only %d allocations", runs);
}

}  // namespace sweep
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr,
                 "usage: %s TMPFS_DIR "
                 "[store|gateway|gateway_stop|connection|reader|connector|worker|no_session|deadline|close|remote|"
                 "reconnect|sweep]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1], part = argc == 3 ? argv[2] : "store";
  if (part == "store") {
    crc_on_the_callers_thread();
    prefault_skipped(dir);
    segment_left_to_its_loads(dir);
    recovery_without_a_thread(dir, 2);
    recovery_without_a_thread(dir, 3);
    piece_pool_with_the_helpers_it_got();
    card_prefault_out_of_memory(dir);
    segment_populate_out_of_memory(dir);
    recovery_scan_out_of_memory(dir);
  } else if (part == "gateway") {
    gateway_start_fails_with_the_reason(dir);
    gateway_refuses_only_that_connection(dir, false);
    gateway_refuses_only_that_connection(dir, true);
  } else if (part == "gateway_stop") {
    // INFO: the stop's log lines (whose arguments are made only where their level is logged) are made and failed.
    ::setenv("ADP_LOG_LEVEL", "INFO", 1);
    gateway_stops_without_memory(dir);
  } else if (part == "connection") {
    gateway_ends_only_that_connection(dir, false);
    gateway_ends_only_that_connection(dir, true);
  } else if (part == "connector") {
    connector_fails_with_the_reason();
  } else if (part == "worker") {
    worker_goes_on_after_a_throwing_prepare();
    worker_goes_on_after_an_exception(0);
    worker_goes_on_after_an_exception(8);
  } else if (part == "no_session") {
    worker_without_a_session_keeps_the_reason();
  } else if (part == "deadline") {
    deadline_goes_on_after_an_exception();
  } else if (part == "close") {
    close_fails_every_pending_batch();
    submit_refused_without_memory();
    card_store_close_throws_nothing(dir);
    destructors_allocate_nothing(dir);
  } else if (part == "reconnect") {
    reconnect_goes_on_after_an_exception(dir);
  } else if (part == "reader") {
    reader_goes_on_after_an_exception(dir);
  } else if (part == "sweep") {
    sweep::allocation_failure_sweep(dir);
  } else if (part == "remote") {
    // DEBUG: the lines whose arguments are made only at DEBUG are made (and failed: the sticky run).
    ::setenv("ADP_LOG_LEVEL", "DEBUG", 1);
    start_connect_without_a_thread(dir);
    reconnect_without_a_thread(dir);
    start_connect_out_of_memory(dir, false);  // last: the old code ended the process here
    start_connect_out_of_memory(dir, true);   // the old code (before allocinfo29) ended it here, at DEBUG
    remote_told_why(dir);
  } else {
    std::fprintf(stderr, "unknown part %s\n", part.c_str());
    return 2;
  }
  return adp::testing::finish("thread_alloc_test");
}
