// SPDX-License-Identifier: Apache-2.0
#include "protocol/shared_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "protocol/frame.h"

namespace adp::proto {
namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;

// A mapping of the payload area plus the control page (r12), or of the
// payload area alone (an r11 client's ring).
Status check_size(uint64_t bytes) {
  constexpr uint64_t kMaxMapped = ring_map_bytes(kMaxRingBytes);
  if (bytes < kMinRingBytes || bytes > kMaxMapped || bytes % kRingAlign)
    return Status::InvalidArgument("ring size " + std::to_string(bytes) + " is not a multiple of 4 KiB in [" +
                                   std::to_string(kMinRingBytes) + ", " + std::to_string(kMaxMapped) + "]");
  return Status::Ok();
}

Status check_attachable(int fd, uint64_t bytes) {
  Status s = check_size(bytes);
  if (!s.ok()) return s;
  // The seals first: the kernel answers them for a memfd and refuses them for any other file without asking its
  // filesystem, where fstat of a FUSE file asks its server, which may be the client and never answer (the
  // connection's thread then waited for good, past stop() and SIGKILL, holding its ring's reservation).
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals)
    return Status::InvalidArgument("ring descriptor is not sealed against shrinking and growing");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes)
    return Status::InvalidArgument("ring descriptor is not a memory file of the stated size");
  return Status::Ok();
}

}  // namespace

Status SharedRing::Map(int fd, uint64_t bytes, std::unique_ptr<SharedRing>* out) {
  // Not populated: a page is allocated when a round first lays bytes out on
  // it, so a connection costs what it uses, not ring_mb. Populating a 1 GiB
  // ring took 1.6 s on a 2-core host (and 8 rings at once, over 10 s), spent
  // inside the first request's deadline and again after every reconnect:
  // the spurious timeouts of issue 9.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return Status::IoError("cannot map the ring: " + errno_text(err));
  }
  out->reset(new SharedRing(fd, static_cast<uint8_t*>(p), bytes));
  return Status::Ok();
}

Status SharedRing::Create(uint64_t bytes, std::unique_ptr<SharedRing>* out) {
  Status s = check_size(bytes);
  if (!s.ok()) return s;
  int fd = ::memfd_create("lmcache-adp-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::IoError("memfd_create: " + errno_text(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 || ::fcntl(fd, F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0) {
    int err = errno;
    ::close(fd);
    return Status::IoError("cannot size the ring: " + errno_text(err));
  }
  return Map(fd, bytes, out);
}

Status SharedRing::Attach(int fd, uint64_t bytes, std::unique_ptr<SharedRing>* out) {
  Status s = check_attachable(fd, bytes);
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  return Map(fd, bytes, out);
}

SharedRing::~SharedRing() {
  ::munmap(data_, size_);
  ::close(fd_);
}

}  // namespace adp::proto
