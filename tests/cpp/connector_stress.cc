// SPDX-License-Identifier: Apache-2.0
// Stress test of the concurrent core without Python, built and run under
// AddressSanitizer and ThreadSanitizer by scripts/sanitize.sh.
//
//   connector_stress CARD_IMAGE [SCALE]
//
// CARD_IMAGE must not exist; a 48 MiB card is created there (1 MiB regions,
// so the workload evicts). SCALE (default 1) multiplies the work, for soak
// runs. Phases:
//   1. Connector (4 workers) over EmbeddedBackend: submitters race mixed
//      kSet/kGet/kExists/kDelete batches against a drainer thread; run three
//      times: normal timeout, 1 ms timeout (deadlines race the workers; some
//      must time out), and close() while submitters are still going (some
//      must fail as closed).
//   2. CardStore directly: threads with their own IoContexts and keys, whose
//      exact state each thread tracks.
//   3. Close and reopen the card (twice), checking what recovery brings back;
//      then a put held between writing and indexing while another thread
//      recycles every region.
//   4. The connector phases through a gateway on the same card (Unix + ring,
//      TCP, 1 ms deadlines on both, stop and restart).
//   5. A gateway with tight limits (clients, ring memory, idle and handshake
//      timeouts) under load, with raw TCP peers churning its handshake pool.
//   7. (run after 5, on its gateway options) The background reconnect (review
//      r14 S2): a connector that saw its gateway stop, left idle while it
//      restarts, reads reachable again with no batch sent; then its workers'
//      batches race for the one connection it made, and close() races the
//      reconnect thread's back-off after a second stop.
//   6. Gateways that never answer (review r14 S1): a Unix socket that never
//      accepts (connects land in its backlog, the handshake waits) and a TCP
//      listener whose full accept queue drops SYNs (connect(2) in progress);
//      close() races the workers' and the start-up connects (RemoteBackend's
//      ConnectWatch against interrupt()) and returns within half of
//      its connect bound (connect_timeout, 2 s), every future completed, the threads joined.
// Content is a function of (key, version), every write a new version, so every
// hit is checked byte for byte; misses are allowed (eviction) but never a hit
// of a key that is known to be gone or of a version known to be overwritten
// (History below, kept across all connector and gateway phases).
// Exit code 0 only if every check passed.

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "connector/connector.h"
#include "gateway/gateway_server.h"
#include "store/card_store.h"
#include "test_card.h"
#include "test_gateway.h"
#include "transport/embedded_backend.h"
#include "transport/remote_backend.h"
#include "util/crc32c.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kCardBytes = 48ull << 20;
constexpr uint64_t kRegionBytes = 1ull << 20;
constexpr size_t kMaxObject = 200 << 10;
constexpr int kConnectorKeys = 400;
constexpr int kHotKeys = 32;         // half of all picks: same-key races between workers
constexpr uint8_t kSentinel = 0xA5;  // fill of get buffers: a miss must leave it

std::atomic<uint64_t> g_failures{0};

void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char* fmt, ...) {
  if (g_failures++ >= 20) return;  // the first few tell the story
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "CHECK FAILED: %s\n", msg);
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t seed_of(std::string_view key, uint64_t version) {
  return adp::hash_key(key) ^ (version * 0xD1B54A32D192ED03ull);
}

// Object size for a seed: tiny, sub-block, whole blocks (zero-copy body, no
// tail), blocks plus a tail, or anything up to kMaxObject.
size_t size_of(uint64_t seed) {
  uint64_t s = seed, r = splitmix(s), v = r >> 3;
  switch (r % 5) {
    case 0:
      return 1 + v % 64;
    case 1:
      return 1 + v % 4095;
    case 2:
      return 4096 * (1 + v % 50);
    case 3:
      return 4096 * (1 + v % 49) + 1 + (v >> 8) % 4095;
    default:
      return 1 + v % kMaxObject;
  }
}

void fill(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t s = ~seed;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = splitmix(s);
    std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
  }
}

bool matches(const uint8_t* p, size_t n, uint64_t seed) {
  uint64_t s = ~seed;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = splitmix(s);
    if (std::memcmp(p + i, &v, std::min<size_t>(8, n - i)) != 0) return false;
  }
  return true;
}

bool all_sentinel(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t c) { return c == kSentinel; });
}

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

// Caller memory for one key: 4 KiB-aligned (the store's zero-copy path) or
// deliberately off by 1..63 bytes (the staged path).
struct Buf {
  std::unique_ptr<uint8_t, FreeDeleter> mem;
  uint8_t* data = nullptr;
  size_t size = 0;
};

Buf make_buf(size_t size, bool aligned, uint64_t r) {
  Buf b;
  size_t cap = (size + 64 + 4095) & ~size_t(4095);
  b.mem.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, cap)));
  if (!b.mem) {
    fprintf(stderr, "out of memory\n");
    std::abort();
  }
  b.data = b.mem.get() + (aligned ? 0 : 1 + r % 63);
  b.size = size;
  return b;
}

std::string connector_key(uint64_t n) { return "conn/" + std::to_string(n); }

// A connector key's object size is fixed (get buffers must fit any version).
size_t connector_size(const std::string& key) { return size_of(seed_of(key, 0)); }

// ---------------------------------------------------------------- history

// Every set and delete of a connector key, for all phases: when it was
// submitted and when its successful completion was seen, on one logical clock.
// A hit of version v is stale when some write w (a set of another version, or
// a delete) was submitted after v's set completed and completed before the get
// was submitted: v was overwritten or deleted, and eviction never brings a key
// back. Failed writes may still have been applied (a timed-out worker goes on),
// so they never count as completed. Ticks are taken before submit() and after
// a completion is seen, which can only hide a violation, never invent one.
constexpr uint64_t kNever = UINT64_MAX;
std::atomic<uint64_t> g_clock{1};
uint64_t tick() { return g_clock.fetch_add(1); }

class History {
 public:
  uint64_t new_version() { return next_version_++; }

  size_t record(const std::string& key, uint64_t version, uint64_t submit) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<Write>& w = writes_[key];
    w.push_back({version, submit, kNever});
    return w.size() - 1;
  }

  void completed(const std::string& key, size_t idx, uint64_t end) {
    std::lock_guard<std::mutex> l(mu_);
    writes_[key][idx].end = end;
  }

  // Why a hit of key with these bytes, for a get submitted at `submit`, is
  // wrong; empty when it is right.
  std::string check_hit(const std::string& key, const uint8_t* data, size_t size, uint64_t submit) {
    std::lock_guard<std::mutex> l(mu_);
    const std::vector<Write>& ws = writes_[key];
    const Write* last = last_done_before(ws, submit);
    bool matched = false;
    for (const Write& w : ws) {
      if (w.version == kDelete || !matches(data, size, seed_of(key, w.version))) continue;
      matched = true;
      if (!last || w.end == kNever || w.end >= last->submit) return {};
    }
    if (!matched) return "bytes of no version ever written";
    return last->version == kDelete ? "a key deleted before the get, read back" : "an overwritten version, read back";
  }

  // Whether key may be present for an exists() submitted at `submit`.
  bool may_exist(const std::string& key, uint64_t submit) {
    std::lock_guard<std::mutex> l(mu_);
    const std::vector<Write>& ws = writes_[key];
    const Write* last = last_done_before(ws, submit);
    for (const Write& w : ws)
      if (w.version != kDelete && (!last || w.end == kNever || w.end >= last->submit)) return true;
    return false;
  }

  static constexpr uint64_t kDelete = 0;

 private:
  struct Write {
    uint64_t version;  // kDelete for a delete
    uint64_t submit, end;
  };

  // Of the writes that completed before `submit`, the one submitted last.
  static const Write* last_done_before(const std::vector<Write>& ws, uint64_t submit) {
    const Write* last = nullptr;
    for (const Write& w : ws)
      if (w.end != kNever && w.end < submit && (!last || w.submit > last->submit)) last = &w;
    return last;
  }

  std::mutex mu_;
  std::unordered_map<std::string, std::vector<Write>> writes_;
  std::atomic<uint64_t> next_version_{1};
};

History g_history;

// ---------------------------------------------------------------- connector

struct Request {
  adp::OpType op;
  std::vector<std::string> keys;
  std::vector<Buf> bufs;  // kSet and kGet: one per key
  bool has_invalid_key = false;
  uint64_t submit_tick = 0;
  std::vector<uint64_t> versions;  // kSet: the version written per key
  std::vector<size_t> writes;      // kSet and kDelete: the History entry per key
  std::vector<uint32_t> snapshot;  // get buffers' CRCs when a failed completion was seen
};

struct Totals {
  std::atomic<uint64_t> submitted{0}, completed{0}, failed{0}, hits{0}, misses{0}, verified_after_fail{0},
      failed_as_expected{0}, stale_checked{0};
};

// Pairs each future id with its completion, whichever the submitter or the
// drainer reports first, and checks each completion once both are known.
class Tracker {
 public:
  // Failures whose error contains expected_error count as failed_as_expected.
  Tracker(Totals& t, const char* expected_error) : totals_(t), expected_error_(expected_error) {}

  // Blocks while `limit` futures are outstanding (bounds memory).
  void acquire_slot(int limit) {
    std::unique_lock<std::mutex> l(mu_);
    slot_cv_.wait(l, [&] { return outstanding_ < limit; });
    outstanding_++;
  }

  void on_submitted(uint64_t id, std::shared_ptr<Request> req) {
    std::lock_guard<std::mutex> l(mu_);
    totals_.submitted++;
    if (!submitted_.insert(id).second) fail("future id %llu returned twice by submit()", ull(id));
    auto early = early_.find(id);
    if (early != early_.end()) {
      check_locked(*req, early->second);
      early_.erase(early);
    } else {
      waiting_.emplace(id, std::move(req));
    }
  }

  void on_completion(adp::Completion c) {
    std::lock_guard<std::mutex> l(mu_);
    if (!completed_.insert(c.future_id).second) {
      fail("future %llu completed twice", ull(c.future_id));
      return;
    }
    auto it = waiting_.find(c.future_id);
    if (it == waiting_.end()) {
      uint64_t id = c.future_id;
      early_.emplace(id, std::move(c));
      return;
    }
    check_locked(*it->second, c);
    waiting_.erase(it);
  }

  // Called when the connector destroys a batch's buffer owner: its workers
  // are done, so its buffers hold their final bytes.
  void on_retired(Request& req) {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < req.snapshot.size(); i++) {
      if (adp::crc32c(req.bufs[i].data, req.bufs[i].size) != req.snapshot[i])
        fail("get buffer of key %s was written after its future completed", req.keys[i].c_str());
    }
    if (!req.snapshot.empty()) totals_.verified_after_fail++;
  }

  // After close() and a final drain: every submitted id completed, once.
  void check_all_done(const char* phase) {
    std::lock_guard<std::mutex> l(mu_);
    if (!waiting_.empty())
      fail("%s: %zu futures never completed (e.g. %llu)", phase, waiting_.size(), ull(waiting_.begin()->first));
    if (!early_.empty())
      fail("%s: %zu completions for ids submit() never returned (e.g. %llu)", phase, early_.size(),
           ull(early_.begin()->first));
    if (submitted_ != completed_) fail("%s: submitted and completed id sets differ", phase);
  }

 private:
  static unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }

  // expected_error_: alternatives separated by '|'.
  bool error_expected(const std::string& error) const {
    std::string_view alts(expected_error_);
    for (size_t at = 0; at <= alts.size();) {
      size_t bar = std::min(alts.find('|', at), alts.size());
      if (error.find(alts.substr(at, bar - at)) != std::string::npos) return true;
      at = bar + 1;
    }
    return false;
  }

  void check_locked(Request& req, const adp::Completion& c) {
    outstanding_--;
    slot_cv_.notify_one();
    totals_.completed++;
    uint64_t end = tick();
    if (!c.ok) totals_.failed++;
    if (!c.ok && expected_error_ && error_expected(c.error)) totals_.failed_as_expected++;
    size_t n = req.keys.size();
    if (c.per_key.size() != n) {
      fail("future %llu (%s): %zu per-key results for %zu keys", ull(c.future_id), adp::op_name(req.op),
           c.per_key.size(), n);
      return;
    }
    if (!c.ok && c.error.empty()) fail("future %llu failed without an error message", ull(c.future_id));
    if (req.has_invalid_key && c.ok) fail("future %llu with an invalid key succeeded", ull(c.future_id));
    if (req.op == adp::OpType::kSet && c.ok) {
      for (size_t i = 0; i < n; i++)
        if (c.per_key[i] != 1) fail("future %llu: set reported ok but key %zu not stored", ull(c.future_id), i);
    }
    // A delete counts where it reported the key gone (deleted, or not there)
    // in a future that succeeded; a failed delete (false, the future failed)
    // may have left the key.
    if (c.ok)
      for (size_t i = 0; i < req.writes.size(); i++)
        if (req.writes[i] != SIZE_MAX && (req.op != adp::OpType::kDelete || c.per_key[i]))
          g_history.completed(req.keys[i], req.writes[i], end);
    if (req.op == adp::OpType::kExists && c.ok) {
      for (size_t i = 0; i < n; i++)
        if (c.per_key[i] && !g_history.may_exist(req.keys[i], req.submit_tick))
          fail("exists(%s) true for a key deleted before it was asked", req.keys[i].c_str());
    }
    if (req.op != adp::OpType::kGet) return;
    for (size_t i = 0; i < n; i++) {
      const Buf& b = req.bufs[i];
      if (c.per_key[i]) {
        totals_.hits++;
        std::string why = g_history.check_hit(req.keys[i], b.data, b.size, req.submit_tick);
        if (!why.empty()) fail("get of %s (%zu bytes) hit: %s", req.keys[i].c_str(), b.size, why.c_str());
      } else if (c.ok) {
        totals_.misses++;
        if (!all_sentinel(b.data, b.size)) fail("get of %s missed but wrote into the buffer", req.keys[i].c_str());
      }
    }
    if (!c.ok) {
      // Workers may still run; they must not touch these buffers any more.
      for (const Buf& b : req.bufs) req.snapshot.push_back(adp::crc32c(b.data, b.size));
    }
  }

  Totals& totals_;
  const char* expected_error_;
  std::mutex mu_;
  std::condition_variable slot_cv_;
  int outstanding_ = 0;
  std::unordered_set<uint64_t> submitted_, completed_;
  std::unordered_map<uint64_t, std::shared_ptr<Request>> waiting_;
  std::unordered_map<uint64_t, adp::Completion> early_;
};

std::atomic<int64_t> g_live_owners{0};

class TestOwner : public adp::BufferOwner {
 public:
  TestOwner(Tracker& t, std::shared_ptr<Request> r) : tracker_(t), req_(std::move(r)) { g_live_owners++; }
  ~TestOwner() override {
    tracker_.on_retired(*req_);
    g_live_owners--;
  }

 private:
  Tracker& tracker_;
  std::shared_ptr<Request> req_;
};

std::shared_ptr<Request> random_request(std::mt19937_64& rng) {
  auto req = std::make_shared<Request>();
  uint64_t r = rng();
  unsigned pick = r % 100;
  req->op = pick < 35   ? adp::OpType::kSet
            : pick < 75 ? adp::OpType::kGet
            : pick < 90 ? adp::OpType::kExists
                        : adp::OpType::kDelete;
  size_t n = (r >> 8) % 50 == 0 ? 0 : 1 + (r >> 16) % 8;  // a few empty batches
  for (size_t i = 0; i < n; i++) req->keys.push_back(connector_key(rng() % (rng() % 2 ? kHotKeys : kConnectorKeys)));
  if (req->op == adp::OpType::kSet || req->op == adp::OpType::kGet) {
    if (n && (r >> 24) % 60 == 0) {  // now and then a key the store must reject, failing the batch
      req->keys[0] = (r >> 32) % 2 ? std::string() : std::string(adp::kMaxKeyBytes + 1, 'x');
      req->has_invalid_key = true;
    }
    for (const std::string& k : req->keys) {
      bool invalid = k.empty() || k.size() > adp::kMaxKeyBytes;
      size_t size = invalid ? 100 : connector_size(k);
      uint64_t a = rng();
      Buf b = make_buf(size, a % 2 == 0, a >> 1);
      if (req->op == adp::OpType::kSet) {
        req->versions.push_back(invalid ? 0 : g_history.new_version());
        fill(b.data, b.size, seed_of(k, req->versions.back()));
      } else {
        std::memset(b.data, kSentinel, b.size);
      }
      req->bufs.push_back(std::move(b));
    }
  }
  return req;
}

struct PhaseSpec {
  const char* name;
  int timeout_ms;
  int submitters;
  int batches_per_submitter;
  int close_after;  // close() once this many futures were submitted; 0 = after the submitters finish
  const char* must_fail_with = nullptr;  // some futures must fail with this in their error
};

// Stamps a request's submit time and records its writes in the history.
void record_submit(Request& req) {
  req.submit_tick = tick();
  for (size_t i = 0; i < req.keys.size(); i++) {
    if (req.has_invalid_key && i == 0)
      req.writes.push_back(SIZE_MAX);  // the store refuses it (the others may be stored)
    else if (req.op == adp::OpType::kSet)
      req.writes.push_back(g_history.record(req.keys[i], req.versions[i], req.submit_tick));
    else if (req.op == adp::OpType::kDelete)
      req.writes.push_back(g_history.record(req.keys[i], History::kDelete, req.submit_tick));
  }
}

using BackendFactory = std::function<std::unique_ptr<adp::Backend>()>;

// midway (default: close the connector) runs once spec.close_after futures were submitted.
void run_connector_phase(const BackendFactory& backend, const PhaseSpec& spec, uint64_t seed, Totals& totals,
                         const std::function<void(adp::Connector&)>& midway = &adp::Connector::close) {
  Totals phase;
  Tracker tracker(phase, spec.must_fail_with);
  adp::ConnectorOptions opts;
  opts.num_workers = 4;
  opts.timeout_ms = spec.timeout_ms;
  adp::Connector conn(backend(), opts);

  std::atomic<bool> stop{false};
  std::thread drainer([&] {
    while (!stop.load()) {
      pollfd p{conn.event_fd(), POLLIN, 0};
      ::poll(&p, 1, 20);
      for (adp::Completion& c : conn.drain()) tracker.on_completion(std::move(c));
      // As a metrics scrape does, while workers send, wait and drop connections
      // (RemoteBackend::stats reads their liveness: gateway_stalled).
      (void)conn.stats();
    }
  });

  std::atomic<int> submitted{0};
  std::vector<std::thread> submitters;
  for (int s = 0; s < spec.submitters; s++) {
    submitters.emplace_back([&, s] {
      std::mt19937_64 rng(seed * 1000 + s);
      for (int i = 0; i < spec.batches_per_submitter; i++) {
        std::shared_ptr<Request> req = random_request(rng);
        std::vector<adp::Buffer> bufs;
        for (Buf& b : req->bufs) bufs.push_back({b.data, b.size});
        tracker.acquire_slot(12);
        record_submit(*req);
        uint64_t id = conn.submit(req->op, req->keys, std::move(bufs), std::make_unique<TestOwner>(tracker, req));
        tracker.on_submitted(id, std::move(req));
        submitted++;
      }
    });
  }

  if (spec.close_after > 0) {
    while (submitted.load() < spec.close_after) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    midway(conn);  // submitters are still going
  }
  for (auto& t : submitters) t.join();
  conn.close();
  stop = true;
  drainer.join();
  for (adp::Completion& c : conn.drain()) tracker.on_completion(std::move(c));
  tracker.check_all_done(spec.name);
  if (spec.must_fail_with && phase.failed_as_expected == 0)
    fail("%s: no future failed with \"%s\" (%llu of %llu failed): the phase did not test what it is for", spec.name,
         spec.must_fail_with, static_cast<unsigned long long>(phase.failed.load()),
         static_cast<unsigned long long>(phase.completed.load()));
  printf("connector_stress: %s: %llu futures, %llu failed (%llu with \"%s\"), %llu hits\n", spec.name,
         static_cast<unsigned long long>(phase.completed.load()), static_cast<unsigned long long>(phase.failed.load()),
         static_cast<unsigned long long>(phase.failed_as_expected.load()),
         spec.must_fail_with ? spec.must_fail_with : "-", static_cast<unsigned long long>(phase.hits.load()));
  totals.submitted += phase.submitted;
  totals.completed += phase.completed;
  totals.failed += phase.failed;
  totals.hits += phase.hits;
  totals.misses += phase.misses;
  totals.verified_after_fail += phase.verified_after_fail;
}

// ---------------------------------------------------------------- card store

// What a thread knows about one of its keys: the version it last stored
// successfully, or 0 when the key is certainly not on the card. Eviction by
// other threads may drop a present key silently, never bring one back.
using KeyState = std::vector<uint64_t>;

std::string direct_key(int thread, int i) { return "direct/" + std::to_string(thread) + "/" + std::to_string(i); }

struct DirectTotals {
  std::atomic<uint64_t> puts{0}, hits{0}, misses{0}, removes{0};
};

// A whole object into memory of our own (the store copies it while checking its CRC).
adp::Status read_object(adp::CardStore& store, adp::IoContext& ctx, const std::string& key, std::vector<uint8_t>* out) {
  return store.get(ctx, key, [out](size_t size, const adp::CopyFn& copy) {
    out->resize(size);
    return copy(out->data());
  });
}

// Checks a hit of key against the state; updates the state after a miss.
void check_read(adp::CardStore& store, adp::IoContext& ctx, const std::string& key, uint64_t& state, DirectTotals& t,
                const char* when) {
  std::vector<uint8_t> obj;
  adp::Status s = read_object(store, ctx, key, &obj);
  const uint8_t* data = obj.data();
  size_t size = obj.size();
  if (s.is_not_found()) {
    t.misses++;
    state = 0;  // gone from the index; only a new put may bring it back
    return;
  }
  if (!s.ok()) {
    fail("%s: get of %s failed: %s", when, key.c_str(), s.message().c_str());
    return;
  }
  t.hits++;
  if (state == 0) {
    fail("%s: %s is deleted or was a miss, yet read back", when, key.c_str());
    return;
  }
  uint64_t seed = seed_of(key, state);
  if (size != size_of(seed) || !matches(data, size, seed))
    fail("%s: %s read back %zu bytes that are not version %llu", when, key.c_str(), size,
         static_cast<unsigned long long>(state));
}

void direct_worker(adp::CardStore& store, int thread, int keys, int iterations, KeyState& state, DirectTotals& t) {
  adp::IoContext ctx;
  std::mt19937_64 rng(7000 + thread);
  uint64_t next_version = 1;
  for (int it = 0; it < iterations; it++) {
    uint64_t r = rng();
    int k = static_cast<int>((r >> 8) % keys);
    std::string key = direct_key(thread, k);
    switch (r % 10) {
      case 0:
      case 1:
      case 2:
      case 3: {  // put a batch of distinct keys
        int n = 1 + (r >> 32) % 4;
        std::vector<std::string> ks;
        std::vector<uint64_t> versions;
        std::vector<Buf> bufs;
        std::vector<adp::PutItem> items;
        for (int i = 0; i < n; i++) {
          int idx = (k + i) % keys;
          ks.push_back(direct_key(thread, idx));
          versions.push_back(next_version++);
          uint64_t seed = seed_of(ks.back(), versions.back());
          uint64_t a = rng();
          bufs.push_back(make_buf(size_of(seed), a % 2 == 0, a >> 1));
          fill(bufs.back().data, bufs.back().size, seed);
        }
        for (int i = 0; i < n; i++) items.push_back({ks[i], bufs[i].data, bufs[i].size});
        std::vector<adp::Status> results(n);
        store.put(ctx, items.data(), n, results.data(), [] { return true; });
        for (int i = 0; i < n; i++) {
          int idx = (k + i) % keys;
          if (results[i].ok()) {
            state[idx] = versions[i];
            t.puts++;
          } else {
            fail("put of %s failed: %s", ks[i].c_str(), results[i].message().c_str());
          }
        }
        break;
      }
      case 4:
      case 5:
      case 6:
        check_read(store, ctx, key, state[k], t, "direct");
        break;
      case 7: {
        bool found = store.exists(key);
        if (found && state[k] == 0) fail("exists(%s) is true for a deleted key", key.c_str());
        if (!found) state[k] = 0;
        break;
      }
      default: {
        bool removed = store.remove(ctx, key).ok();
        if (removed && state[k] == 0) fail("remove(%s) removed a key that was not there", key.c_str());
        if (removed) t.removes++;
        state[k] = 0;
        break;
      }
    }
  }
}

// A put whose objects span two regions seals the first region before any of
// its objects is indexed. Another thread cycles the whole card while the put
// sits in that window (inside still_wanted(), which the store calls between
// writing and indexing): the objects the put reports stored must be readable.
void check_commit_window(adp::CardStore& store) {
  const std::string keys[2] = {"window/0", "window/1"};
  std::vector<Buf> bufs;
  adp::PutItem items[2];
  for (int i = 0; i < 2; i++) {
    bufs.push_back(make_buf(600 << 10, true, 0));  // two do not fit one 1 MiB region
    fill(bufs[i].data, bufs[i].size, seed_of(keys[i], 1));
    items[i] = {keys[i], bufs[i].data, bufs[i].size};
  }
  auto other_writer = [&] {
    adp::IoContext ctx;
    Buf filler = make_buf(900 << 10, true, 0);  // one per region
    fill(filler.data, filler.size, 0);
    for (uint64_t i = 0; i < 2 * store.stats().num_regions; i++) {
      std::string key = "window/filler/" + std::to_string(i);
      adp::PutItem item{key, filler.data, filler.size};
      adp::Status r;
      store.put(ctx, &item, 1, &r, [] { return true; });
    }
  };
  adp::IoContext ctx;
  adp::Status results[2];
  store.put(ctx, items, 2, results, [&] {
    std::thread(other_writer).join();
    return true;
  });
  for (int i = 0; i < 2; i++) {
    if (!results[i].ok()) {
      fail("commit window: put of %s failed: %s", keys[i].c_str(), results[i].message().c_str());
      continue;
    }
    std::vector<uint8_t> obj;
    adp::Status s = read_object(store, ctx, keys[i], &obj);
    const uint8_t* data = obj.data();
    size_t size = obj.size();
    if (!s.ok())
      fail("commit window: %s was reported stored but reads as: %s", keys[i].c_str(), s.message().c_str());
    else if (size != bufs[i].size || !matches(data, size, seed_of(keys[i], 1)))
      fail("commit window: %s read back wrong bytes", keys[i].c_str());
  }
}

// Connector keys after a reopen: any hit must hold the key's bytes.
void check_connector_keys(adp::CardStore& store, uint64_t* hits) {
  adp::IoContext ctx;
  for (int n = 0; n < kConnectorKeys; n++) {
    std::string key = connector_key(n);
    std::vector<uint8_t> obj;
    adp::Status s = read_object(store, ctx, key, &obj);
    const uint8_t* data = obj.data();
    size_t size = obj.size();
    if (s.is_not_found()) continue;
    if (!s.ok()) {
      fail("reopen: get of %s failed: %s", key.c_str(), s.message().c_str());
      continue;
    }
    ++*hits;
    std::string why =
        size != connector_size(key) ? std::string("wrong size") : g_history.check_hit(key, data, size, tick());
    if (!why.empty()) fail("reopen: %s read back: %s", key.c_str(), why.c_str());
  }
}

void check_store_health(const adp::CardStore& store, const char* when) {
  adp::StoreStats st = store.stats();
  if (st.checksum_failures)
    fail("%s: %llu checksum failures", when, static_cast<unsigned long long>(st.checksum_failures));
  if (st.io_errors) fail("%s: %llu I/O errors", when, static_cast<unsigned long long>(st.io_errors));
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// n exists batches at once on conn; how many succeeded.
int exists_batches(adp::Connector& conn, int n) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; i++) ids.push_back(conn.submit(adp::OpType::kExists, {connector_key(i)}, {}, nullptr));
  int ok = 0;
  for (size_t done = 0; done < ids.size();) {
    pollfd p{conn.event_fd(), POLLIN, 0};
    ::poll(&p, 1, 20);
    for (const adp::Completion& c : conn.drain()) {
      done++;
      ok += c.ok;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int scale = argc == 3 ? std::atoi(argv[2]) : 1;
  if (argc < 2 || argc > 3 || scale < 1) {
    fprintf(stderr, "usage: %s CARD_IMAGE [SCALE]  (CARD_IMAGE: a path that does not exist yet)\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    fprintf(stderr, "%s exists; pass a new path (the test formats the card)\n", path.c_str());
    return 2;
  }
  auto t0 = Clock::now();

  const adp::CardOptions card = adp::testing::card_options(kRegionBytes, path, kCardBytes);
  std::shared_ptr<adp::CardStore> store = adp::testing::checked_card(card, "open card " + path);
  if (!store) return 1;

  // 1. Connector phases.
  Totals totals;
  const PhaseSpec phases[] = {
      {"normal", 30000, 3, 300 * scale, 0},
      {"1ms-timeout", 1, 3, 150 * scale, 0, "timed out"},
      {"close-midway", 30000, 3, 200 * scale, 240 * scale, "closed"},
  };
  uint64_t phase_seed = 1;
  auto embedded = [&] { return std::make_unique<adp::EmbeddedBackend>(store); };
  for (const PhaseSpec& p : phases) run_connector_phase(embedded, p, phase_seed++, totals);
  if (g_live_owners != 0) fail("%lld buffer owners were never destroyed", static_cast<long long>(g_live_owners.load()));
  check_store_health(*store, "connector phases");

  // 2. CardStore directly: threads on the same store, each its own IoContext.
  constexpr int kDirectThreads = 3, kDirectKeys = 60;
  const int direct_iterations = 1000 * scale;
  std::vector<KeyState> states(kDirectThreads, KeyState(kDirectKeys, 0));
  DirectTotals direct;
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kDirectThreads; t++)
      threads.emplace_back(direct_worker, std::ref(*store), t, kDirectKeys, direct_iterations, std::ref(states[t]),
                           std::ref(direct));
    for (auto& t : threads) t.join();
  }
  check_store_health(*store, "direct phase");
  adp::StoreStats before = store->stats();
  if (before.evicted_regions == 0) fail("the workload never evicted a region; the card is too large for the test");

  // 3. Reopen: recovered objects read back exactly; deleted ones stay gone.
  store.reset();
  store = adp::testing::checked_card(card, "reopen card " + path);
  if (!store) return 1;
  uint64_t recovered = store->stats().recovered_objects;
  if (recovered != before.objects)
    fail("reopen recovered %llu objects; %llu were indexed at close", static_cast<unsigned long long>(recovered),
         static_cast<unsigned long long>(before.objects));
  uint64_t conn_hits = 0;
  check_connector_keys(*store, &conn_hits);
  DirectTotals reopened;
  {
    adp::IoContext ctx;
    for (int t = 0; t < kDirectThreads; t++)
      for (int k = 0; k < kDirectKeys; k++) check_read(*store, ctx, direct_key(t, k), states[t][k], reopened, "reopen");
    // Overwrite what survived: after another reopen the newer copy must win
    // (the recovered store continues the sequence numbers).
    for (int t = 0; t < kDirectThreads; t++) {
      for (int k = 0; k < kDirectKeys; k++) {
        if (!states[t][k]) continue;
        std::string key = direct_key(t, k);
        uint64_t version = states[t][k] + 1000000;
        uint64_t seed = seed_of(key, version);
        Buf b = make_buf(size_of(seed), k % 2 == 0, k);
        fill(b.data, b.size, seed);
        adp::PutItem item{key, b.data, b.size};
        adp::Status r;
        store->put(ctx, &item, 1, &r, [] { return true; });
        if (r.ok())
          states[t][k] = version;
        else
          fail("put after reopen of %s failed: %s", key.c_str(), r.message().c_str());
      }
    }
  }
  check_store_health(*store, "first reopen");
  store.reset();
  store = adp::testing::checked_card(card, "reopen card " + path + " a second time");
  if (!store) return 1;
  {
    adp::IoContext ctx;
    for (int t = 0; t < kDirectThreads; t++)
      for (int k = 0; k < kDirectKeys; k++)
        check_read(*store, ctx, direct_key(t, k), states[t][k], reopened, "second reopen");
  }
  check_store_health(*store, "second reopen");
  check_commit_window(*store);  // last: it recycles every region
  check_store_health(*store, "commit window");
  store.reset();

  // 4. The connector phases again through a gateway on the same card: Unix
  // socket with a small ring (batches go in rounds), TCP, deadlines racing
  // the wire, the gateway stopped under load, then restarted (reconnect).
  Totals via_gateway;
  {
    adp::GatewayOptions go;
    go.card.path = path;
    go.socket_path = path + ".sock";
    go.tcp_listen = "tcp://127.0.0.1:0";
    go.token = "stress-token";
    go.io_contexts = 3;
    std::unique_ptr<adp::GatewayServer> gw = adp::testing::start_gateway(go);
    if (!gw) return 1;
    go.tcp_listen = "tcp://127.0.0.1:" + std::to_string(gw->tcp_port());  // the same port after the restart
    auto remote = [&](bool tcp) {
      return [&, tcp] {
        adp::GatewayClientOptions o;
        adp::proto::parse_endpoint(tcp ? go.tcp_listen : "unix://" + go.socket_path, &o.endpoint);
        o.token = go.token;
        o.ring_bytes = tcp ? 0 : 1 << 20;
        return std::make_unique<adp::RemoteBackend>(o);
      };
    };
    const PhaseSpec gateway_phases[] = {
        {"gateway-unix", 30000, 3, 150 * scale, 0},
        {"gateway-tcp", 30000, 3, 100 * scale, 0},
        {"gateway-1ms-timeout", 1, 3, 100 * scale, 0, "timed out|deadline passed"},
        // TCP: puts copied into the session's staging under the guard, then sent
        {"gateway-tcp-1ms-timeout", 1, 3, 100 * scale, 0, "timed out|deadline passed"},
        {"gateway-close-midway", 30000, 3, 100 * scale, 120 * scale, "closed"},
    };
    for (const PhaseSpec& p : gateway_phases)
      run_connector_phase(remote(p.name[8] == 't'), p, phase_seed++, via_gateway);
    {
      // The Unix phases' loads into anonymous buffers went straight into this process (r5).
      const std::string st = gw->stats_json();
      const size_t at = st.find("\"process_loads\":");
      if (at == std::string::npos || std::strtoull(st.c_str() + at + 16, nullptr, 10) == 0)
        fail("no load through the gateway was written into process memory: %s", st.c_str());
    }
    run_connector_phase(remote(false), {"gateway-stopped-midway", 2000, 3, 100 * scale, 60 * scale, "unavailable"},
                        phase_seed++, via_gateway, [&](adp::Connector&) { gw->stop(); });
    gw.reset();
    gw = adp::testing::start_gateway(go);  // the restart
    if (!gw) return 1;
    run_connector_phase(remote(false), {"gateway-restarted", 30000, 3, 100 * scale, 0}, phase_seed++, via_gateway);
    gw.reset();

    // 5. The gateway's limits (issue 9) under load: fewer slots and less ring
    // memory than the connector's workers ask for (some connects refused with
    // an Error frame, ring reservations racing), idle connections closed
    // between batches (the client's stale-connection retry), while raw TCP
    // peers connect, send nothing or garbage, and leave.
    adp::GatewayOptions lo = go;
    lo.max_clients = 2;
    lo.max_tcp_clients = 2;
    lo.max_handshakes = 2;
    lo.handshake_timeout_ms = 100;
    lo.idle_timeout_ms = 20;
    lo.max_ring_total_bytes = 2 << 20;  // two rings of 1 MiB
    gw = adp::testing::start_gateway(lo);
    if (!gw) return 1;
    std::atomic<bool> stop_peers{false};
    std::thread peers([&] {
      adp::proto::Endpoint ep;
      adp::proto::parse_endpoint(lo.tcp_listen, &ep);
      for (int i = 0; !stop_peers; i++) {
        int fd = -1;
        if (!adp::proto::connect_endpoint(ep, Clock::now() + std::chrono::milliseconds(200), &fd).ok()) continue;
        if (i % 2) {
          ssize_t w = ::send(fd, "GARBAGE!GARBAGE!GARBAGE!", 24, MSG_NOSIGNAL);
          (void)w;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(i % 3 == 0 ? 150 : 1));
        ::close(fd);
      }
    });
    run_connector_phase(
        remote(false),
        {"gateway-limits-unix", 30000, 3, 100 * scale, 0, "too many local clients|ring memory is used up"},
        phase_seed++, via_gateway);
    run_connector_phase(remote(true), {"gateway-limits-tcp", 30000, 3, 100 * scale, 0, "too many TCP clients"},
                        phase_seed++, via_gateway);
    stop_peers = true;
    peers.join();
    gw.reset();

    // 7. The background reconnect.
    for (int round = 0; round < 3 * scale; round++) {
      gw = adp::testing::start_gateway(go);
      if (!gw) return 1;
      adp::ConnectorOptions opts;
      opts.num_workers = 4;
      opts.timeout_ms = 2000;
      adp::Connector conn(remote(false)(), opts);
      const auto batches = [&](int n) { return exists_batches(conn, n); };
      // Until the connector reads `reachable` (with a batch now and then, `poking`), or fails after `within`.
      const auto until_reachable = [&](bool reachable, bool poking, double within, const char* what) {
        const auto t0 = Clock::now();
        while (conn.stats().gateway_reachable != reachable) {
          if (since(t0) > within) {
            fail("round %d: %s not seen within %.0f s", round, what, within);
            return false;
          }
          if (poking) (void)batches(1);
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return true;
      };
      if (batches(4) != 4) fail("round %d: batches on a running gateway failed", round);
      gw.reset();  // stopped: the next batches find it gone
      if (!until_reachable(false, true, 30, "the outage")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(150 * round));  // the back-off at other points
      gw = adp::testing::start_gateway(go);
      if (!gw) return 1;
      // No batch: the background reconnect (kMaxBackoff, 2 s, at the longest; slack for a sanitizer's pace).
      if (!until_reachable(true, false, 15, "reachable again with no traffic")) break;
      if (batches(8) != 8) fail("round %d: batches after the background reconnect failed", round);
      if (round % 2) {
        gw.reset();
        if (!until_reachable(false, true, 30, "the second outage")) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(30));  // into the reconnect thread's back-off
        const auto t0 = Clock::now();
        conn.close();
        if (since(t0) > 1.0) fail("round %d: close() took %.2f s during the background back-off", round, since(t0));
      }
      conn.close();
      gw.reset();
    }
    printf("connector_stress: background reconnect: %d rounds\n", 3 * scale);

    // 7b. An idle connector whose connections the gateway closes (a 100 ms idle timeout): the reconnect thread
    // asks status queries (review r15 N13) while batches come now and then, then sees the gateway stop.
    {
      adp::GatewayOptions io = go;
      io.idle_timeout_ms = 100;
      gw = adp::testing::start_gateway(io);
      if (!gw) return 1;
      adp::ConnectorOptions opts;
      opts.num_workers = 4;
      opts.timeout_ms = 2000;
      adp::Connector conn(remote(false)(), opts);
      const auto field = [&](const char* name) {
        const std::string st = gw->stats_json(), key = std::string("\"") + name + "\":";
        const size_t at = st.find(key);
        return at == std::string::npos ? ~0ull : std::strtoull(st.c_str() + at + key.size(), nullptr, 10);
      };
      for (int i = 0; i < 3 * scale; i++) {
        const int ok = exists_batches(conn, 4);
        if (ok != 4) fail("idle probes, round %d: %d of 4 batches succeeded", i, ok);
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // idle closes, looks, status queries
        if (!conn.stats().gateway_reachable) fail("idle probes, round %d: unreachable while the gateway runs", i);
        if (field("clients") != 0 || field("ring_bytes") != 0)
          fail("idle probes, round %d: the idle connector holds %llu clients, %llu ring bytes", i,
               static_cast<unsigned long long>(field("clients")), static_cast<unsigned long long>(field("ring_bytes")));
      }
      gw.reset();  // stopped while idle: a status query fails
      const auto t0 = Clock::now();
      while (conn.stats().gateway_reachable && since(t0) < 15)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (conn.stats().gateway_reachable) fail("idle probes: the stop while idle not seen within 15 s");
      conn.close();
    }
    printf("connector_stress: idle probes: %d rounds\n", 3 * scale);
  }
  // 6. Gateways that never answer: close() with connects in flight.
  {
    const std::string silent_path = path + ".silent.sock";
    adp::proto::Endpoint unix_ep, tcp_ep;
    adp::proto::parse_endpoint("unix://" + silent_path, &unix_ep);
    adp::proto::parse_endpoint("tcp://127.0.0.1:0", &tcp_ep);
    int unix_fd = -1, tcp_fd = -1, filler = -1;
    adp::Status s = adp::proto::listen_endpoint(&unix_ep, 4096, &unix_fd);
    if (s.ok()) s = adp::proto::listen_endpoint(&tcp_ep, 0, &tcp_fd);
    // One connection fills a backlog-0 accept queue: the kernel drops the SYNs of the next ones.
    if (s.ok()) s = adp::proto::connect_endpoint(tcp_ep, Clock::now() + std::chrono::seconds(5), &filler);
    if (!s.ok()) fail("silent listeners: %s", s.message().c_str());
    std::mt19937_64 rng(phase_seed);
    for (int round = 0; s.ok() && round < 6 * scale; round++) {
      const bool tcp = round % 2;
      const auto remote = [&] {
        adp::GatewayClientOptions o;
        o.endpoint = tcp ? tcp_ep : unix_ep;
        o.token = "stress-token";
        o.ring_bytes = tcp ? 0 : 1 << 20;
        return std::make_unique<adp::RemoteBackend>(o);
      };
      const auto close_promptly = [&](adp::Connector& c) {
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));  // connects under way, or just begun
        const auto t0 = Clock::now();
        c.close();
        if (since(t0) > 1.0) fail("close() took %.2f s with connects to a silent gateway in flight", since(t0));
      };
      const std::string name = std::string(tcp ? "silent-tcp-syn-" : "silent-unix-handshake-") + std::to_string(round);
      run_connector_phase(remote, {name.c_str(), 30000, 2, 20, 8, "closed"}, phase_seed++, via_gateway, close_promptly);
    }
    for (int fd : {unix_fd, tcp_fd, filler})
      if (fd >= 0) ::close(fd);
    ::unlink(silent_path.c_str());
  }

  if (via_gateway.hits == 0) fail("no get through the gateway ever hit");
  printf("connector_stress: gateway phases: %llu futures (%llu failed, %llu hits, %llu misses)\n",
         static_cast<unsigned long long>(via_gateway.completed.load()),
         static_cast<unsigned long long>(via_gateway.failed.load()),
         static_cast<unsigned long long>(via_gateway.hits.load()),
         static_cast<unsigned long long>(via_gateway.misses.load()));

  if (totals.hits == 0) fail("no connector get ever hit");
  if (direct.hits == 0 || reopened.hits == 0)
    fail("no direct get hit (direct %llu, after reopen %llu)", static_cast<unsigned long long>(direct.hits.load()),
         static_cast<unsigned long long>(reopened.hits.load()));
  uint64_t failures = g_failures.load();
  printf(
      "connector_stress: %s in %.1f s: connector %llu futures (%llu failed, %llu hits, %llu misses, %llu "
      "checked after failing), direct %llu puts %llu hits %llu removes, %llu regions evicted, reopen %llu "
      "recovered %llu hits, %llu check failures\n",
      failures ? "FAIL" : "PASS", since(t0), static_cast<unsigned long long>(totals.completed.load()),
      static_cast<unsigned long long>(totals.failed.load()), static_cast<unsigned long long>(totals.hits.load()),
      static_cast<unsigned long long>(totals.misses.load()),
      static_cast<unsigned long long>(totals.verified_after_fail.load()),
      static_cast<unsigned long long>(direct.puts.load()), static_cast<unsigned long long>(direct.hits.load()),
      static_cast<unsigned long long>(direct.removes.load()), static_cast<unsigned long long>(before.evicted_regions),
      static_cast<unsigned long long>(recovered), static_cast<unsigned long long>(reopened.hits.load() + conn_hits),
      static_cast<unsigned long long>(failures));
  return failures ? 1 : 0;
}
