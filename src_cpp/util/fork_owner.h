// SPDX-License-Identifier: Apache-2.0
// ForkOwner: tells an object's process (the one that made it) from a child fork() made of it, without a syscall a
// call. A connector or card store inherited across fork() shares its card, its parent's in-memory view of it and its
// gateway connections with the parent, and the parent's threads are not in the child: such objects refuse their work
// there (debt39).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace adp {

namespace detail {
extern std::atomic<uint64_t> g_forks;
}  // namespace detail

// Forks of this process: bumped in each child fork() makes (pthread_atfork's child handler, registered as the library
// is loaded; os.fork and multiprocessing's fork run it; a vfork child execs before it could matter). A relaxed load.
// The only count of them (fork40: store/card_device.cc's AIO writer kept one of its own).
inline uint64_t fork_count() { return detail::g_forks.load(std::memory_order_relaxed); }

class ForkOwner {
 public:
  ForkOwner();
  // True in a process forked (at any depth) from the one that made it.
  bool inherited() const { return fork_count() != forks_; }
  // The process that made it.
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
  uint64_t forks_;
};

// A descriptor (and a shared mapping of its file, if any) that a forked child must not keep (fork40): a card's, whose
// exclusive flock belongs to its open file description, which a child's copy of the descriptor or of the mapping
// keeps alive, so that the card stayed locked while the child lived (its parent could not open it again after closing
// it). From the registration on, in each child fork() makes (pthread_atfork's child handler), the number is made to
// refer to an O_PATH descriptor of "/" instead (dup3: reads, writes, flock and fdatasync there fail EBADF) and the
// mapping is replaced by an inaccessible anonymous one at the same place (mmap MAP_FIXED). The number and the place
// stay the registering object's in the child: its close() and munmap there, if any, release those and never another
// object's. Between fork() and the child's handler (the child not yet scheduled: microseconds, more on a loaded host)
// the child's copies are still there; once its fork() returned in the child they are gone. forget() before the
// descriptor is closed (or the mapping unmapped) in the process that registered it. Both take a lock the fork's prepare
// handler takes too (so a fork never sees the list half changed).
void fork_release(int fd, void* map, size_t map_bytes);
void fork_release_forget(int fd);

}  // namespace adp
