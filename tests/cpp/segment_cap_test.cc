// SPDX-License-Identifier: Apache-2.0
// A segment larger than the whole of --max-segment-total-gb (review33d): no state of the gateway ever maps it, so
// the refusal is about the file (InvalidArgument: its buffers take the ring for good), not "for now" (Busy with
// kSegmentRetryLater, protocol r19), which has the connector register it again every 60 s for the process's life,
// dropping its connection each time. One within the cap but past what is left of it is refused for now.
//
//   segment_cap_test <tmpfs dir>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "check.h"
#include "protocol/client_segment.h"
#include "protocol/frame.h"

using adp::proto::ClientSegment;

namespace {
constexpr uint64_t kMiB = 1 << 20;

int make(const std::string& path, uint64_t bytes) {
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  CHECK(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0, "create %s", path.c_str());
  return fd;
}
}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (!adp::testing::one_argument(argc, argv, "TMPFS_DIR", &dir)) return 2;
  const std::string base = dir + "/adp-segment-cap-" + std::to_string(::getpid());
  const uint64_t cap = 4 * kMiB;

  std::unique_ptr<ClientSegment> big;
  adp::Status s = ClientSegment::Attach(make(base + "-big", 8 * kMiB), 8 * kMiB, cap, &big);
  CHECK(!s.ok() && s.message().find(adp::proto::kSegmentRetryLater) == std::string::npos,
        "a file larger than the whole cap is refused for good, not for now: %s", s.message().c_str());

  std::unique_ptr<ClientSegment> a, b;
  s = ClientSegment::Attach(make(base + "-a", 3 * kMiB), 3 * kMiB, cap, &a);
  CHECK(s.ok(), "3 MiB within a 4 MiB cap: %s", s.message().c_str());
  s = ClientSegment::Attach(make(base + "-b", 2 * kMiB), 2 * kMiB, cap, &b);
  CHECK(!s.ok() && s.message().find(adp::proto::kSegmentRetryLater) == 0,
        "2 MiB more past what is left of the cap is refused for now: %s", s.message().c_str());
  for (const char* suffix : {"-big", "-a", "-b"}) ::unlink((base + suffix).c_str());
  return adp::testing::finish("segment_cap_test");
}
