// SPDX-License-Identifier: Apache-2.0
#include "util/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

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

ExtentWalk walk_resident_pages(int fd, const uint8_t* map, uint64_t size, uint64_t window_bytes,
                               const std::function<bool(uint64_t offset, uint64_t n)>& piece) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t whole = size / page * page;  // mincore looks at whole pages only
  const uint64_t window = std::max<uint64_t>(window_bytes / page * page, page);
  std::vector<unsigned char> vec(window / page);
  ExtentWalk w;
  uint64_t at = 0;
  while (at < whole) {
    // ENXIO: no data past `at`. tmpfs answers at once when `at` is data (the
    // page cache's first entry), and skips the empty nodes of a hole.
    const off_t data = ::lseek(fd, static_cast<off_t>(at), SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;
    if (data < 0) {
      w.end = ExtentWalk::End::kSeekFailed;
      w.at = at;
      w.err = errno;
      return w;
    }
    const uint64_t from = static_cast<uint64_t>(data) / page * page;
    if (from >= whole) break;
    const uint64_t to = std::min(from + window, whole);
    if (::mincore(const_cast<uint8_t*>(map) + from, to - from, vec.data()) != 0) {
      w.end = ExtentWalk::End::kSeekFailed;
      w.at = from;
      w.err = errno;
      return w;
    }
    const uint64_t pages = (to - from) / page;
    for (uint64_t i = 0; i < pages;) {
      if (!(vec[i] & 1)) {
        i++;
        continue;
      }
      uint64_t j = i + 1;
      while (j < pages && (vec[j] & 1)) j++;
      if (!piece(from + i * page, (j - i) * page)) {
        w.end = ExtentWalk::End::kStopped;
        return w;
      }
      i = j;
    }
    at = to;
  }
  return w;
}

}  // namespace adp
