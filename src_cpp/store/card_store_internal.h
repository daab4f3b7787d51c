// SPDX-License-Identifier: Apache-2.0
// What CardStore's own files share (card_store.cc, card_store_reserve.cc,
// card_store_put.cc, card_store_get.cc, card_store_remove.cc) and nothing
// else includes: the scope of a store operation (StoreCall, which
// card_store_unwound() and card_store_calls_on_this_thread() report), the
// piece sizes a load and a store both use, the clock, and the memory failure
// whose making allocates nothing. What one file alone uses stays in it.
// These were file-local (an anonymous namespace) in the one card_store.cc;
// they are `inline` in namespace adp, so g_store_unwound and t_store_calls
// are one flag and one count a thread across the files (an anonymous
// namespace here would give each file its own).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>

#include "util/status.h"

namespace adp {

inline std::atomic<bool> g_store_unwound{false};
inline thread_local int t_store_calls = 0;

// Inside a card store operation for a scope; an exception that leaves it marks the store unwound.
class StoreCall {
 public:
  StoreCall() : uncaught_(std::uncaught_exceptions()) { t_store_calls++; }
  ~StoreCall() {
    t_store_calls--;
    if (std::uncaught_exceptions() > uncaught_) g_store_unwound.store(true, std::memory_order_release);
  }
  StoreCall(const StoreCall&) = delete;
  StoreCall& operator=(const StoreCall&) = delete;

 private:
  const int uncaught_;
};

// On a memory-speed card, loads read straight into the caller's buffer and
// stores write straight from it in pieces of this size, each checksummed
// while it is in the CPU's cache (L2), so the CRC adds no pass over memory.
inline constexpr size_t kPieceBytes = 1u << 20;

// A kPieces load (a disk card) reads straight into the caller's buffer in
// pieces of this size, asking the caller's guard before each: the time a
// load can go on writing after its caller gave up is one piece's read. Large
// enough to keep the device's request size (4 MiB on this VM's virtio disk:
// /sys/block/*/queue/max_sectors_kb), small enough that the CRC of a piece
// runs while it is still in the CPU's last-level cache.
inline constexpr size_t kGuardedPieceBytes = 4u << 20;

using Clock = std::chrono::steady_clock;

// A failure for want of this process's memory whose making allocates nothing (its message fits std::string's
// own buffer): what a store operation reports where an allocation threw (std::bad_alloc) part way, the change
// it had begun undone (session 26).
inline Status no_memory() { return Status::IoError("out of memory", Status::IoClass::kGatewayMemory); }

}  // namespace adp
