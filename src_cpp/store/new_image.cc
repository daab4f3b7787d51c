// SPDX-License-Identifier: Apache-2.0
#include "store/new_image.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

#include "util/amount.h"

namespace adp {

namespace {

Status truncate_to(int fd, const std::string& path, uint64_t bytes) {
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) return Status::Ok();
  return Status::IoError("cannot size new card image " + path + ": " + errno_text(errno));
}

}  // namespace

Status size_new_image(int fd, const std::string& path, uint64_t bytes, bool sparse_asked, bool memory,
                      uint64_t free_bytes, NewImage* out) {
  *out = NewImage{};
  if (sparse_asked || memory) {
    out->sparse = true;
    // The default (no preallocation asked): "sparse", the line as it was before preallocation could be asked for.
    out->how =
        sparse_asked ? "sparse" : "sparse: on tmpfs, where its blocks are memory, taken as stores first write them";
    return truncate_to(fd, path, bytes);
  }
  const auto start = std::chrono::steady_clock::now();
  int rc;
  // A signal can interrupt a large allocation: asking again allocates the rest.
  do rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes));
  while (rc != 0 && errno == EINTR);
  if (rc == 0) {
    char t[64];
    std::snprintf(t, sizeof t, "%.2f s",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    out->how = std::string("its blocks allocated in ") + t;
    return Status::Ok();
  }
  const int e = errno;
  if (e == EOPNOTSUPP || e == ENOSYS) {
    // posix_fallocate would emulate it by writing every block of the image:
    // minutes for a large card, at creation. Sparse instead.
    out->sparse = true;
    out->how = "sparse: its filesystem cannot allocate blocks without writing them (fallocate: " + errno_text(e) +
               "); they are allocated as stores first write them";
    return truncate_to(fd, path, bytes);
  }
  if (e == ENOSPC || e == EDQUOT)
    return Status::NoSpace("cannot create card image " + path + " of " + log_amount(bytes) + " (" +
                           std::to_string(bytes) + " bytes): its filesystem cannot allocate it (" + errno_text(e) +
                           "; it reported " + log_amount(free_bytes) + " (" + std::to_string(free_bytes) +
                           " bytes) free, some of which its own records of the image take); give a size that fits "
                           "or make room");
  return Status::IoError("cannot reserve the blocks of new card image " + path + " of " + std::to_string(bytes) +
                         " bytes (fallocate: " + errno_text(e) + ")");
}

}  // namespace adp
