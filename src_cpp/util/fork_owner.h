// SPDX-License-Identifier: Apache-2.0
// ForkOwner: tells an object's process (the one that made it) from a child fork() made of it, without a syscall a
// call. A connector or card store inherited across fork() shares its card, its parent's in-memory view of it and its
// gateway connections with the parent, and the parent's threads are not in the child: such objects refuse their work
// there (debt39).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace adp {

// Forks of this process: bumped in each child fork() makes (pthread_atfork's child handler, registered at the first
// call; os.fork and multiprocessing's fork run it; a vfork child execs before it could matter). A relaxed load.
uint64_t fork_count();

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

}  // namespace adp
