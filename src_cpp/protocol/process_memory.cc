// SPDX-License-Identifier: Apache-2.0
#include "protocol/process_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5
#endif
#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL  // Linux 6.9: a pidfd of one thread, readable once that thread exited
#endif

namespace adp::proto {
namespace {

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};  // a pidfd is readable once what it names exited
  return ::poll(&p, 1, 0) != 0;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// A pidfd of the peer of `sock`: SO_PEERPIDFD names the very process that
// connected; before Linux 6.5, pidfd_open of SO_PEERCRED's pid (the probe
// then proves it is still that process's memory).
int peer_pidfd(int sock, pid_t pid) {
  int fd = -1;
  socklen_t len = sizeof fd;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) return fd;
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// Drops CAP_SYS_PTRACE from the calling thread's effective set (capset on
// pid 0 changes this thread's credentials only), once per thread. Then the
// kernel judges each process_vm_readv/writev of this thread by the rules an
// unprivileged ptracer of the gateway's uid meets: same uid, the target
// dumpable (not a setuid exec), Yama's ptracer relation, and (a root
// gateway) the target's permitted capabilities a subset of ours. Permitted
// stays as it was, so a root client still passes that subset check.
// False (errno set) if the drop failed: no transfer is then attempted.
bool drop_ptrace_capability() {
  thread_local bool dropped = false;
  if (dropped) return true;
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &hdr, data) != 0) return false;
  constexpr unsigned kWord = CAP_SYS_PTRACE / 32, kBit = 1u << (CAP_SYS_PTRACE % 32);
  if (data[kWord].effective & kBit) {
    data[kWord].effective &= ~kBit;
    if (::syscall(SYS_capset, &hdr, data) != 0) return false;
  }
  dropped = true;
  return true;
}

}  // namespace

Status ProcessMemory::Attach(int sock, uint32_t claimed_pid, uint64_t probe_addr, std::span<const uint8_t> probe,
                             std::unique_ptr<ProcessMemory>* out) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return Status::Unavailable("the socket's peer is unknown (SO_PEERCRED: " + errno_text(errno) + ")");
  if (cred.pid <= 0 || static_cast<uint32_t>(cred.pid) != claimed_pid)
    return Status::InvalidArgument("the client names pid " + std::to_string(claimed_pid) + ", the kernel says pid " +
                                   std::to_string(cred.pid) + " (another PID namespace?)");
  int pidfd = peer_pidfd(sock, cred.pid);
  if (pidfd < 0) return Status::Unavailable("no pidfd for pid " + std::to_string(cred.pid) + ": " + errno_text(errno));
  std::unique_ptr<ProcessMemory> pm(new ProcessMemory(cred.pid, pidfd));
  if (!pm->alive()) return Status::Unavailable("the client process exited");
  std::vector<uint8_t> seen(probe.size());
  Status s = pm->read(probe_addr, seen.data(), seen.size());
  if (s.code() == Status::Code::kUnavailable) return s;
  if (!s.ok()) return Status::InvalidArgument("the probe at " + hex(probe_addr) + " cannot be read: " + s.message());
  if (std::memcmp(seen.data(), probe.data(), probe.size()) != 0)
    return Status::InvalidArgument("the probe at " + hex(probe_addr) + " holds other bytes than the client sent");
  *out = std::move(pm);
  return Status::Ok();
}

ProcessMemory::~ProcessMemory() {
  ::close(pidfd_);
  if (thread_pidfd_ >= 0) ::close(thread_pidfd_);
}

// A process's pidfd is readable once its whole thread group exited: a main
// thread that exited (a zombie leader) while others run leaves it alive.
bool ProcessMemory::alive() const { return !readable(pidfd_); }

pid_t ProcessMemory::target() const {
  std::lock_guard<std::mutex> lock(mu_);
  return target_;
}

bool ProcessMemory::retarget_locked() {
  // No other transfer polls thread_pidfd_ now (they poll it under mu_), and
  // none closes it: its number cannot be another descriptor when closed.
  if (thread_pidfd_ >= 0) ::close(thread_pidfd_);
  thread_pidfd_ = -1;
  target_ = pid_;
  gen_++;
  const std::string task = "/proc/" + std::to_string(pid_) + "/task";
  DIR* d = ::opendir(task.c_str());  // one PID namespace with the client: Attach checked it
  if (!d) return false;
  while (const dirent* e = ::readdir(d)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
    if (tid <= 0 || tid == pid_) continue;
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, tid, PIDFD_THREAD));
    if (fd < 0) continue;  // gone meanwhile, or a kernel before 6.9
    // The number listed may have been handed to another task before the
    // pidfd was taken: still one of this process's threads, and alive, now
    // that the pidfd holds it (a live thread's number is not reused).
    if (::access((task + "/" + e->d_name).c_str(), F_OK) == 0 && !readable(fd)) {
      thread_pidfd_ = fd;
      target_ = tid;
      break;
    }
    ::close(fd);
  }
  ::closedir(d);
  return target_ != pid_;
}

bool ProcessMemory::current_locked(Target* t) {
  // The thread named instead of an exited main thread must still be there
  // (its number could otherwise name another task by now).
  if (target_ != pid_ && readable(thread_pidfd_) && !(alive() && retarget_locked())) return false;
  *t = {target_, gen_};
  return true;
}

bool ProcessMemory::renew(Target* t) {
  std::lock_guard<std::mutex> lock(mu_);
  // Another transfer retargeted since t was taken: retry with its thread.
  if (gen_ == t->gen && !retarget_locked()) return false;
  return current_locked(t);
}

Status ProcessMemory::write(uint64_t addr, const void* src, size_t len) {
  return transfer(true, addr, const_cast<void*>(src), len);
}

Status ProcessMemory::read(uint64_t addr, void* dst, size_t len) { return transfer(false, addr, dst, len); }

Status ProcessMemory::transfer(bool write, uint64_t addr, void* local, size_t len) {
  // The kernel's unprivileged ptrace rules are the only authority over
  // which process this thread may touch (docs/protocol.md, "What a hostile
  // client can do"): never with CAP_SYS_PTRACE in effect.
  if (!drop_ptrace_capability())
    return Status::Unavailable("cannot drop CAP_SYS_PTRACE before touching pid " + std::to_string(pid_) + ": " +
                               errno_text(errno));
  Target t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_locked(&t)) return Status::Closed("the client process is gone");
  }
  size_t done = 0;
  int retargets = 0;
  while (done < len) {
    iovec l{static_cast<uint8_t*>(local) + done, len - done};
    iovec r{reinterpret_cast<void*>(addr + done), len - done};
    ssize_t n = write ? ::process_vm_writev(t.tid, &l, 1, &r, 1, 0) : ::process_vm_readv(t.tid, &l, 1, &r, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);  // partial: the next call starts where it stopped (and faults there if it must)
      continue;
    }
    const int err = n == 0 ? EFAULT : errno;
    if (err == EINTR) continue;
    // ESRCH with the process alive: its main thread (or the thread named
    // instead) exited; another thread of it names the same memory (found by
    // this transfer, or by another one that met the same exit first).
    if (err == ESRCH && alive() && retargets++ < 3 && renew(&t)) continue;
    const std::string where = std::to_string(len) + " bytes at " + hex(addr) + " in pid " + std::to_string(pid_);
    if (err == ESRCH || !alive()) return Status::Closed("the client process is gone");
    // EPERM's causes, at most 200 bytes with any pid (logs clip there: log_safe).
    if (err == EPERM)
      return Status::Unavailable("no access to the memory of pid " + std::to_string(pid_) +
                                 " (EPERM: Yama ptrace_scope, another uid, a seccomp filter, or not dumpable: prctl "
                                 "PR_SET_DUMPABLE 0 or a setuid exec, /proc/" +
                                 std::to_string(pid_) + "/status then owned by root)");
    if (err == EFAULT)
      return Status::InvalidArgument(std::string(write ? "cannot write " : "cannot read ") + where + " (not mapped" +
                                     (write ? " writable" : "") + " there)");
    return Status::IoError(
        std::string(write ? "process_vm_writev of " : "process_vm_readv of ") + where + ": " + errno_text(err),
        Status::IoClass::kClientMemory);
  }
  return Status::Ok();
}

}  // namespace adp::proto
