// SPDX-License-Identifier: Apache-2.0
// The I/O errors a card image's device (store/card_device.h) actually makes,
// and how they are read: a read and a write that the kernel fails (EFAULT: a
// buffer that is not mapped, the only failure of preadv/pwritev an unprivileged
// test can cause on any filesystem), a read past the image's end (the image
// cut short under the open device) and a failed fdatasync (a pipe put in the
// device's fd's place: EINVAL; review r13 N1). Each is an I/O error of the card
// (transport/card_io_error.h: not the gateway's memory nor the client's),
// without a class (a gateway sends it as the card's), saying what failed where;
// each message is printed as "MESSAGE <read|write|end|sync> <message>" for
// tests/gateway/test_card_io_error.py, which answers a connector's load with it.
//
//   card_io_error_test DIR   (the image DIR/card-io-error.img, removed at the end)
#include "transport/card_io_error.h"

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "check.h"
#include "store/card_device.h"
#include "util/status.h"

namespace {

using adp::Status;

constexpr size_t kBlock = 4096;
constexpr uint64_t kImageBytes = 1u << 20;

// st is an I/O error of the card whose message starts with `start` and names the image; its message printed
// as "MESSAGE <kind> ...".
void check_card_error(const Status& st, const char* kind, const char* what, const std::string& start,
                      const std::string& path) {
  const std::string& m = st.message();
  std::printf("MESSAGE %s %s\n", kind, m.c_str());
  CHECK(st.code() == Status::Code::kIoError, "%s: an I/O error (code %d: %s)", what, int(st.code()), m.c_str());
  CHECK(st.io_class() == Status::IoClass::kUnsaid, "%s: no class (the gateway sends it as the card's)", what);
  CHECK(adp::card_io_error(st), "%s: read as the card's I/O error: '%s'", what, m.c_str());
  CHECK(m.starts_with(start), "%s: the message starts '%s': '%s'", what, start.c_str(), m.c_str());
  CHECK(m.find(path) != std::string::npos, "%s: the message names the image: '%s'", what, m.c_str());
}

// One anonymous page of `prot` (PROT_NONE: the kernel can copy neither into nor out of it), or nullptr.
void* page_of(int prot) {
  void* p = ::mmap(nullptr, kBlock, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED, "mmap of a page (prot %d)", prot);
  return p == MAP_FAILED ? nullptr : p;
}

// The descriptor of this process open on `path` (its /proc/self/fd link), or -1 (none, or more than one).
int fd_of(const std::string& path) {
  int found = -1, count = 0;
  for (int fd = 0; fd < 1024; ++fd) {
    char link[PATH_MAX];
    const ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof(link) - 1);
    if (n > 0 && std::string(link, size_t(n)) == path) found = fd, ++count;
  }
  CHECK(count == 1, "one descriptor open on %s (found %d)", path.c_str(), count);
  return count == 1 ? found : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::one_argument(argc, argv, "DIR", &dir)) return 2;
  const std::string path = dir + "/card-io-error.img";
  ::unlink(path.c_str());
  std::unique_ptr<adp::CardDevice> dev;
  Status st = adp::CardDevice::Open(path, kImageBytes, &dev);
  CHECK(st.ok(), "open %s: %s", path.c_str(), st.message().c_str());
  if (!st.ok()) return 1;

  void* page = page_of(PROT_NONE);
  void* buf = page_of(PROT_READ | PROT_WRITE);
  if (!page || !buf) return 1;
  const iovec bad{page, kBlock}, good{buf, kBlock};

  st = dev->readv(2 * kBlock, &bad, 1);
  check_card_error(st, "read", "a failed read", "read of 4096 bytes at offset 8192 of ", path);

  st = dev->writev(3 * kBlock, &bad, 1);
  check_card_error(st, "write", "a failed write", "write of 4096 bytes at offset 12288 of ", path);

  // The image cut to 64 KiB under the open device (which took its size at open): a read past the cut.
  CHECK(::truncate(path.c_str(), 16 * kBlock) == 0, "truncate %s", path.c_str());
  st = dev->readv(32 * kBlock, &good, 1);
  check_card_error(st, "end", "a read past the image's end", "unexpected end of card ", path);

  // A pipe's end put in the device's descriptor's place (one thread here: nothing else uses it meanwhile):
  // fdatasync of a pipe fails EINVAL, the one way to make it fail without root on any filesystem.
  const int fd = fd_of(path);
  int pipe_fds[2];
  CHECK(::pipe(pipe_fds) == 0, "pipe: %s", std::strerror(errno));
  if (fd < 0 || ::dup2(pipe_fds[0], fd) != fd) return 1;
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  st = dev->sync(dev->write_mark());
  check_card_error(st, "sync", "a failed fdatasync", "fdatasync of ", path);
  CHECK(st.message().ends_with(" failed: Invalid argument"), "fdatasync's error: '%s'", st.message().c_str());

  ::munmap(page, kBlock);
  ::munmap(buf, kBlock);
  dev.reset();
  ::unlink(path.c_str());
  return adp::testing::finish("card_io_error_test");
}
