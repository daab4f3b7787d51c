// SPDX-License-Identifier: Apache-2.0
// ProcessMemory: the address space of the process at the other end of a
// Unix socket, which the gateway writes loads into (process_vm_writev) and
// reads stores from (process_vm_readv) with no ring between them (protocol
// r5, docs/protocol.md "Process memory"). LMCache's default L1 pool is
// anonymous memory of its process: this is how one copy reaches it.
//
// Attach() proves, before anything is granted, that
//   - the socket's peer (SO_PEERCRED, taken from the kernel) is the pid the
//     client claims as it sees it (another PID namespace differs: refused);
//   - this gateway holds a pidfd of that very process (SO_PEERPIDFD, or
//     pidfd_open on kernels before 6.5);
//   - it may read the process's memory: the probe's bytes, read at the
//     address the client named, are the ones it sent (EPERM from Yama, a
//     uid, a client not dumpable or a seccomp filter: refused).
// A refusal is no protocol error: the connection keeps the ring.
//
// Every thread drops CAP_SYS_PTRACE from its effective capabilities before
// its first transfer: the kernel's unprivileged ptrace rules decide, even in
// a gateway that runs as root (a setuid process, another uid, a process
// that did not name the gateway under Yama: EPERM, whatever pid it names).
//
// Transfers are all or nothing: a short transfer or EFAULT (an address not
// mapped, or not writable, in the client) is an error of that transfer;
// a pidfd that says the process (its whole thread group) exited means the
// client is gone. ESRCH while the pidfd says it lives means only its main
// thread exited (the kernel finds no address space through a zombie
// leader's pid): the transfers then name another live thread of the group,
// held by a thread pidfd (PIDFD_THREAD, Linux 6.9+; before, the client is
// taken as gone, as it was).
//
// Thread safety: write(), read() and alive() may run on several threads at
// once (a process load's pieces go out on its connection's thread and on
// helpers). The thread named and its pidfd change under mu_ only; each
// transfer takes them with a generation, and after ESRCH retargets only if
// no other transfer did since (else it retries with the thread that one
// found). A thread pidfd is polled and closed under mu_ only, so no
// transfer polls or closes a number another one closed (review r7 B2).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

#include "util/status.h"

namespace adp::proto {

class ProcessMemory {
 public:
  // Ok with *out set, or the reason the peer of Unix socket `sock` is
  // refused (InvalidArgument for a claim that does not hold, Unavailable
  // where the kernel denies access).
  static Status Attach(int sock, uint32_t claimed_pid, uint64_t probe_addr, std::span<const uint8_t> probe,
                       std::unique_ptr<ProcessMemory>* out);
  ~ProcessMemory();
  ProcessMemory(const ProcessMemory&) = delete;
  ProcessMemory& operator=(const ProcessMemory&) = delete;

  // Writes len bytes from src at addr in the client.
  Status write(uint64_t addr, const void* src, size_t len);
  // Reads len bytes at addr in the client into dst.
  Status read(uint64_t addr, void* dst, size_t len);
  // False once the client process exited (its pidfd is readable).
  bool alive() const;
  pid_t pid() const { return pid_; }
  // The thread transfers name: the pid, or, once the main thread exited,
  // another thread of the process.
  pid_t target() const;

 private:
  // The thread a transfer names, and the generation of target_ it was taken at.
  struct Target {
    pid_t tid;
    uint64_t gen;
  };
  ProcessMemory(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd), target_(pid) {}
  Status transfer(bool write, uint64_t addr, void* local, size_t len);
  // Under mu_: the thread to name in *t (a new one if the thread named
  // instead of the main thread exited); false if none is left.
  bool current_locked(Target* t);
  // After ESRCH naming t: retargets unless another transfer did since t was
  // taken; then *t is the thread to retry with. False: none is left.
  bool renew(Target* t);
  // Under mu_: names a live thread of the process other than its (exited)
  // main thread in target_, holding a pidfd of that thread (the old one
  // closed, the generation bumped); false if there is none.
  bool retarget_locked();
  const pid_t pid_;
  const int pidfd_;
  mutable std::mutex mu_;
  pid_t target_;           // under mu_
  int thread_pidfd_ = -1;  // under mu_: of target_ when it is not pid_
  uint64_t gen_ = 0;       // under mu_: bumped by each retarget
};

}  // namespace adp::proto
