// SPDX-License-Identifier: Apache-2.0
// populate_write (util/populate.h), MADV_POPULATE_WRITE made in one place: on
// a kernel that has the call it allocates a tmpfs file's pages; a range it
// cannot populate (a read-only mapping, an address not page-aligned) fails as
// EINVAL for that call only, not taken for the kernel's refusal (later calls
// are still made); once refused (the test hook, as a kernel before Linux 5.14)
// every call fails as EINVAL and none is made: no page is allocated.
//
//   populate_test <tmpfs dir>
#include "util/populate.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "check.h"

namespace {

constexpr size_t kPage = 4096, kBytes = 64 * kPage;

// 512-byte blocks allocated to the file.
long long blocks(int fd) {
  struct stat st{};
  ::fstat(fd, &st);
  return static_cast<long long>(st.st_blocks);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: populate_test <tmpfs dir>\n");
    return 2;
  }
  const std::string path = std::string(argv[1]) + "/populate-test.img";
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_TRUNC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, kBytes) == 0, "create %s", path.c_str());
  auto* rw = static_cast<uint8_t*>(::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  auto* ro = static_cast<uint8_t*>(::mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0));
  CHECK(rw != MAP_FAILED && ro != MAP_FAILED, "mmap");

  // A range the call cannot populate: EINVAL, nothing allocated.
  errno = 0;
  CHECK(!adp::populate_write(ro, 4 * kPage) && errno == EINVAL, "read-only mapping: false, EINVAL (errno %d)", errno);
  errno = 0;
  CHECK(!adp::populate_write(rw + 1, kPage) && errno == EINVAL, "unaligned: false, EINVAL (errno %d)", errno);
  CHECK(blocks(fd) == 0, "nothing allocated by the failed calls (%lld blocks)", blocks(fd));

  // Not taken for the kernel's refusal: the next call is made, and allocates.
  CHECK(adp::populate_write(rw, 4 * kPage), "writable mapping: populated");
  CHECK(blocks(fd) == 4 * kPage / 512, "its 4 pages allocated (%lld blocks)", blocks(fd));

  // Refused (the hook: a kernel before 5.14): false, EINVAL, no call made, again and again.
  adp::refuse_populate_for_test();
  for (int i = 0; i < 3; i++) {
    errno = 0;
    CHECK(!adp::populate_write(rw + 8 * kPage, 4 * kPage) && errno == EINVAL, "refused: false, EINVAL (errno %d)",
          errno);
  }
  CHECK(blocks(fd) == 4 * kPage / 512, "no call made once refused (%lld blocks)", blocks(fd));

  ::munmap(rw, kBytes);
  ::munmap(ro, kBytes);
  ::close(fd);
  ::unlink(path.c_str());
  return adp::testing::finish("populate_test");
}
