// SPDX-License-Identifier: Apache-2.0
// load_profile: optional sums of the time the gateway's process loads (and,
// since session thirteen, its segment loads: the seg_* steps) spend
// in each step (benchmarks/README.md, "Session eight: loads"), to tell the
// per-object and per-piece costs apart on a machine without perf. Off
// unless the gateway starts with ADP_LOAD_PROFILE=1 in its environment;
// off, a step costs one branch on a constant read once. On, each thread
// sums into its own counters (no shared cache line on the hot path) and the
// gateway's stats add them up ("load_profile_<step>_ns" and "..._n").
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace adp::load_profile {

enum Step : int {
  kBatch,      // a get batch with process items, whole (connection thread)
  kObject,     // load_into_process, whole
  kLookup,     // get_via_bounce up to the first piece: index lookup, first look, header check
  kPin,        // a piece's pin (card lock, index and epochs compared)
  kCopy,       // a piece's copy card -> bounce with its CRC
  kUnpin,      // a piece's unpin (card lock)
  kSink,       // a piece's sink, whole: gate, deadline, liveness, lease, write
  kAlive,      // the client's liveness poll
  kLease,      // joining and leaving the load lease
  kWrite,      // process_vm_writev (inside in_client_memory's bookkeeping)
  kRun,        // get_via_bounce's pieces, all (on this thread and helpers)
  kCombine,    // joining the pieces' CRCs
  kPiece,      // a piece, whole, in the gateway's card gate
  kIndex,      // lookup's part: the key's index entry (card lock)
  kFirstLook,  // lookup's part: extents, epochs and pins of the object (card lock)
  kHeader,     // lookup's part: the header block copied (then unpinned: card lock), and checked
  // A get item into a client's segment (r3; benchmarks/README.md, "Session thirteen"):
  kSegItem,     // the item whole: its I/O context taken (if none held) to store.get returned
  kSegContext,  // acquire_context, when the batch held none
  kSegGet,      // store.get: index lookup, the read into the segment with its CRC, the deliver callback
  kSegPrepare,  // the segment's pages looked up (and populated the first time)
  kSegLease,    // the load lease taken and given back
  kSegCopy,     // the card read straight into the segment with its CRC (the copy callback, under the lease)
  kSteps
};
inline constexpr const char* kNames[kSteps] = {
    "batch",    "object",      "lookup",  "pin",         "copy",      "unpin",   "sink",       "alive",
    "lease",    "write",       "run",     "combine",     "piece",     "index",   "first_look", "header",
    "seg_item", "seg_context", "seg_get", "seg_prepare", "seg_lease", "seg_copy"};

static_assert(kNames[kSteps - 1] != nullptr, "a name for every step");

inline const bool kEnabled = [] {
  const char* v = std::getenv("ADP_LOAD_PROFILE");
  return v && std::strcmp(v, "1") == 0;
}();

struct Sums {
  std::array<std::atomic<uint64_t>, kSteps> ns{}, n{};
};

// Every thread's sums (a thread's stay after it ends: few threads, opt-in).
struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<Sums>> all;
};
inline Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may outlive static destruction
  return *r;
}

inline Sums& mine() {
  thread_local std::shared_ptr<Sums> s = [] {
    auto p = std::make_shared<Sums>();
    std::lock_guard<std::mutex> l(registry().mu);
    registry().all.push_back(p);
    return p;
  }();
  return *s;
}

inline uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Single writer per Sums: a load and a store, no read-modify-write.
inline void add(Step s, uint64_t ns) {
  Sums& m = mine();
  m.ns[s].store(m.ns[s].load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
  m.n[s].store(m.n[s].load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// Times a scope into step s (nothing when off).
class Timer {
 public:
  explicit Timer(Step s) : s_(s), t0_(kEnabled ? now_ns() : 0) {}
  ~Timer() {
    if (kEnabled) add(s_, now_ns() - t0_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  const Step s_;
  const uint64_t t0_;
};

// The sums over every thread so far.
inline void totals(uint64_t ns[kSteps], uint64_t n[kSteps]) {
  std::fill(ns, ns + kSteps, 0);
  std::fill(n, n + kSteps, 0);
  std::lock_guard<std::mutex> l(registry().mu);
  for (const auto& s : registry().all)
    for (int i = 0; i < kSteps; i++) {
      ns[i] += s->ns[i].load(std::memory_order_relaxed);
      n[i] += s->n[i].load(std::memory_order_relaxed);
    }
}

}  // namespace adp::load_profile
