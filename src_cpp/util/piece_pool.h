// SPDX-License-Identifier: Apache-2.0
// PiecePool: helper threads that take pieces of a job beside the thread that
// runs it. The gateway's process loads use it (docs/protocol.md, "Process
// memory"): each piece of an object is copied from the card into a bounce
// buffer with its CRC, then written into the client with process_vm_writev,
// and one thread a connection does that at 0.6x of embedded's fused copy
// (benchmarks/README.md, "Session seven").
//
// The caller always works its own job; helpers only add to it. A helper
// joins a job only while it is idle and fewer threads are working pieces
// than the CPUs the pool was given, and one job takes at most max_helpers of
// them, and at most CPUs / callers - 1 where callers is the number of
// Caller guards alive (the connections loading now; at least 1): 4
// connections on 16 CPUs take 2 helpers each, 8 take 1, 16 none (on the
// 16-core machine helpers beside 16 connections cost 2 MiB loads 0.7x). So a job never waits for a helper to come free:
// a helper stalled in one client's write (memory that client never serves) holds back only that client's job, which
// waits for its own pieces; every other job goes on at least at the speed of its own thread. A pool of 0 threads is the
// serial loop.
//
// Threading: run() from any number of threads at once; stop() from any
// thread (pieces in flight finish; helpers then leave and the callers finish
// their jobs alone); the destructor stops, and must not race a run().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace adp {

class PiecePool {
 public:
  // piece(i, slot): slot 0 is the caller, 1..max_helpers the helpers in the
  // order they joined; one thread at a time per slot, so a job's per-slot
  // buffers need no lock. false: no further piece of the job is started.
  using PieceFn = std::function<bool(size_t piece, int slot)>;

  // threads helper threads, named adp-gw-piece; a job takes at most
  // max_helpers; helpers join while fewer than cpus threads work pieces.
  PiecePool(int threads, int max_helpers, int cpus);
  ~PiecePool();
  PiecePool(const PiecePool&) = delete;
  PiecePool& operator=(const PiecePool&) = delete;

  // Runs piece(i, slot) once for each i in [0, n) that is started (all of
  // them unless one returned false), in any order, on this thread and on
  // helpers; returns once every piece started has returned. False if a
  // piece returned false. alone: on this thread only, no helper joins (it
  // still counts as a thread working pieces, for the other jobs' helpers).
  // A piece that throws (on any thread) stops the job as a failed one does;
  // the first exception is rethrown here once every piece started returned.
  bool run(size_t n, const PieceFn& piece, bool alone = false);
  // Whether a job run now could take a helper: the pool has helper threads,
  // is not stopping, and the callers alive leave a job at least one
  // (CPUs / callers - 1). The gateway writes an object in larger pieces
  // when not, on its own thread (ClientHandler::load_into_process).
  bool helpers_now() const;
  // Whether the callers alive leave each at least one CPU beside its own
  // thread (CPUs / callers >= 2), helper threads or not: the gateway reads a
  // large process store on a second thread of its connection only then
  // (ClientHandler::store_pipelined), by the rule the helpers keep.
  bool spare_cpu() const;
  // Helpers finish the piece they are in and leave; later jobs run on their
  // callers alone. Waits for the helper threads to end.
  void stop();

  // Counts a caller (a connection with loads to run) while it lives: the
  // helpers one job may take shrink as callers grow.
  class Caller {
   public:
    explicit Caller(PiecePool* pool) : pool_(pool) {
      if (pool_) pool_->callers_.fetch_add(1, std::memory_order_relaxed);
    }
    ~Caller() {
      if (pool_) pool_->callers_.fetch_sub(1, std::memory_order_relaxed);
    }
    Caller(const Caller&) = delete;
    Caller& operator=(const Caller&) = delete;

   private:
    PiecePool* pool_;
  };

  int threads() const { return static_cast<int>(threads_.size()); }
  int max_helpers() const { return max_helpers_; }
  // Caller guards alive now (the stats' process_piece_callers).
  int callers() const { return callers_.load(std::memory_order_relaxed); }
  // Pieces run by helpers so far (the pool's use, for the stats).
  uint64_t helped_pieces() const { return helped_.load(std::memory_order_relaxed); }

  // The CPUs this process may use, at least 1: sched_getaffinity's count, or
  // its cgroup's CPU quota where that is fewer (util/cpu_quota.h: ceil(quota
  // / period), read once per process). A test names a cpu.max file in its
  // place (ADP_TEST_CPU_MAX_FILE: `cpu_max_file`, read each call). Feeds the
  // gateway's piece helpers (their count by default and PiecePool's CPU rule)
  // and the spin load rule of both sides (util/idle_cpus.h).
  static int usable_cpus(const std::string& cpu_max_file = {});
  // usable_cpus() as the start lines give it: "4 usable CPUs", or "2 usable
  // CPUs (the cgroup's CPU quota; 16 by affinity)" where the quota is fewer.
  static std::string usable_cpus_text(const std::string& cpu_max_file = {});
  // True on a helper thread of any pool (tests pick which thread stalls).
  static bool on_helper_thread();

 private:
  // The CPUs the callers alive leave each beside its own thread:
  // CPUs / callers - 1 (callers at least 1). The one rule of helper_limit()
  // and spare_cpu().
  int cpus_beside_each_caller() const;
  // The helpers a job run now may take: none without helper threads or once
  // stopping, else min(max_helpers, cpus_beside_each_caller()), at least 0.
  // run() gives a job this many; helpers_now() is whether it is above 0.
  int helper_limit() const;
  struct Job {
    const PieceFn* piece;
    size_t n;
    int limit = 0;  // helpers it may take
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    // The first exception a piece threw (session 25), on any thread: the job stops as for a failed piece, and run()
    // rethrows it on its caller's thread once every helper has left the job (a helper's ended the process before).
    std::atomic<bool> threw{false};
    std::exception_ptr error;
    int joined = 0;   // helpers that took part (under mu_)
    int running = 0;  // helpers in it now (under mu_)
  };
  // Takes pieces of job until none is left (or one failed, or a helper is
  // told to stop); the number run.
  size_t work(Job& job, int slot, bool helper);
  void helper_loop();

  const int max_helpers_, cpus_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;  // helpers: a job was queued, or stop
  std::condition_variable left_;  // callers: a helper left a job
  std::vector<Job*> queue_;       // jobs that may take a helper
  uint64_t generation_ = 0;       // jobs queued so far
  std::atomic<bool> stopping_{false};
  std::atomic<int> busy_{0};     // threads working pieces now
  std::atomic<int> callers_{0};  // Caller guards alive
  std::atomic<uint64_t> helped_{0};
};

}  // namespace adp
