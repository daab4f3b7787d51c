// SPDX-License-Identifier: Apache-2.0
#include "util/prefault.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace adp {

ExtentWalk walk_written_extents(int fd, uint64_t size, const std::function<bool(uint64_t offset, uint64_t n)>& piece) {
  ExtentWalk w;
  off_t at = 0;
  while (static_cast<uint64_t>(at) < size) {
    // ENXIO: no data past `at`.
    off_t data = ::lseek(fd, at, SEEK_DATA);
    off_t hole = data < 0 ? -1 : ::lseek(fd, data, SEEK_HOLE);
    if (data < 0 && errno == ENXIO) break;
    if (hole < 0) {
      w.end = ExtentWalk::End::kSeekFailed;
      w.at = static_cast<uint64_t>(at);
      w.err = errno;
      return w;
    }
    const uint64_t end = std::min<uint64_t>(static_cast<uint64_t>(hole), size);
    for (uint64_t p = static_cast<uint64_t>(data); p < end; p += kPrefaultPieceBytes) {
      if (!piece(p, std::min(kPrefaultPieceBytes, end - p))) {
        w.end = ExtentWalk::End::kStopped;
        return w;
      }
    }
    at = hole;
  }
  return w;
}

}  // namespace adp
