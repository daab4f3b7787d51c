// SPDX-License-Identifier: Apache-2.0
#include "util/piece_pool.h"

#include <sched.h>

#include <algorithm>

#include "util/cpu_quota.h"
#include "util/log.h"
#include "util/thread_name.h"

namespace adp {

namespace {
thread_local bool t_helper = false;

struct CpuCounts {
  int affinity;  // sched_getaffinity's, at least 1
  int quota;     // the cgroup's CPU quota, 0: none
  int usable() const { return quota > 0 ? std::min(affinity, quota) : affinity; }
};

CpuCounts count_cpus(const std::string& cpu_max_file) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int affinity = ::sched_getaffinity(0, sizeof set, &set) != 0 ? 1 : std::max(1, CPU_COUNT(&set));
  static const int kQuota = cgroup_quota_cpus();  // read once per process
  return {affinity, cpu_max_file.empty() ? kQuota : cpu_max_cpus(cpu_max_file)};
}
}  // namespace

bool PiecePool::on_helper_thread() { return t_helper; }

int PiecePool::usable_cpus(const std::string& cpu_max_file) { return count_cpus(cpu_max_file).usable(); }

std::string PiecePool::usable_cpus_text(const std::string& cpu_max_file) {
  const CpuCounts c = count_cpus(cpu_max_file);
  const int n = c.usable();
  std::string text = std::to_string(n) + (n == 1 ? " usable CPU" : " usable CPUs");
  if (n < c.affinity) text += " (the cgroup's CPU quota; " + std::to_string(c.affinity) + " by affinity)";
  return text;
}

PiecePool::PiecePool(int threads, int max_helpers, int cpus)
    : max_helpers_(std::max(0, max_helpers)), cpus_(std::max(1, cpus)) {
  if (max_helpers_ == 0) threads = 0;
  // A helper that cannot be started (std::system_error: a pids limit, memory for its stack; std::bad_alloc: its
  // state, or threads_' storage): the pool goes on with those started (none: each job on its caller alone), where
  // the exception ended the gateway's start (a joinable thread destroyed in the unwinding: std::terminate).
  try {
    threads_.reserve(static_cast<size_t>(std::max(0, threads)));
    for (int i = 0; i < threads; i++)
      threads_.emplace_back([this, i] {
        set_thread_name("adp-gw-piece", i);
        t_helper = true;
        helper_loop();
      });
  } catch (const std::exception& e) {
    ADP_WARN(
        "gateway: %zu of %d process-memory piece helper threads started (%s): pieces run on the connections' "
        "threads and the helpers started",
        threads_.size(), threads, e.what());
  }
}

PiecePool::~PiecePool() { stop(); }

void PiecePool::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  // Never from a helper of this pool in practice (no helper holds what owns
  // the pool: GatewayShared lives in the connections' threads); from one,
  // the destructor would then destroy its own joinable thread (terminate).
  for (auto& t : threads_)
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
}

size_t PiecePool::work(Job& job, int slot, bool helper) {
  size_t ran = 0;
  while (!job.failed.load(std::memory_order_acquire) && !(helper && stopping_.load(std::memory_order_relaxed))) {
    const size_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.n) break;
    ran++;
    bool ok = false;
    try {
      ok = (*job.piece)(i, slot);
    } catch (...) {
      if (!job.threw.exchange(true, std::memory_order_acq_rel)) job.error = std::current_exception();
    }
    if (!ok) job.failed.store(true, std::memory_order_release);
  }
  return ran;
}

int PiecePool::cpus_beside_each_caller() const {
  const int callers = std::max(1, callers_.load(std::memory_order_relaxed));
  return cpus_ / callers - 1;
}

int PiecePool::helper_limit() const {
  if (threads_.empty() || stopping_.load(std::memory_order_relaxed)) return 0;
  return std::max(0, std::min(max_helpers_, cpus_beside_each_caller()));
}

bool PiecePool::helpers_now() const { return helper_limit() > 0; }

bool PiecePool::spare_cpu() const { return cpus_beside_each_caller() >= 1; }

bool PiecePool::run(size_t n, const PieceFn& piece, bool alone) {
  Job job;
  job.piece = &piece;
  job.n = n;
  job.limit = helper_limit();
  const bool shared = !alone && n > 1 && job.limit > 0;
  if (shared) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(&job);
      generation_++;
    }
    // As many helpers as the job may take and CPUs are spare (the helpers
    // check again before joining), one by one: waking every idle helper for
    // each job cost 2 MiB x 16 loads on 16 cores half their speed (a herd of
    // wake-ups per object; benchmarks/README.md, "Session seven").
    const int spare = cpus_ - busy_.load(std::memory_order_relaxed) - 1;
    for (int i = 0; i < std::min(spare, job.limit); i++) wake_.notify_one();
  }
  busy_.fetch_add(1, std::memory_order_relaxed);
  work(job, 0, false);
  busy_.fetch_sub(1, std::memory_order_relaxed);
  if (shared) {
    std::unique_lock<std::mutex> lock(mu_);
    auto at = std::find(queue_.begin(), queue_.end(), &job);
    if (at != queue_.end()) queue_.erase(at);
    left_.wait(lock, [&] { return job.running == 0; });  // every piece a helper took has returned
  }
  if (job.threw.load(std::memory_order_acquire)) std::rethrow_exception(job.error);
  return !job.failed.load(std::memory_order_acquire);
}

void PiecePool::helper_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t seen = 0;
  while (!stopping_) {
    Job* job = nullptr;
    for (Job* j : queue_)
      if (j->next.load(std::memory_order_relaxed) < j->n) {
        job = j;
        break;
      }
    if (!job || busy_.load(std::memory_order_relaxed) >= cpus_) {
      // Nothing to join, or no CPU spare: wait for the next job.
      seen = generation_;
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      continue;
    }
    const int slot = ++job->joined;
    job->running++;
    if (job->joined >= job->limit) queue_.erase(std::find(queue_.begin(), queue_.end(), job));
    lock.unlock();
    busy_.fetch_add(1, std::memory_order_relaxed);
    const size_t ran = work(*job, slot, true);
    busy_.fetch_sub(1, std::memory_order_relaxed);
    helped_.fetch_add(ran, std::memory_order_relaxed);
    lock.lock();
    if (--job->running == 0) left_.notify_all();
  }
}

}  // namespace adp
