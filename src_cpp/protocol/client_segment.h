// SPDX-License-Identifier: Apache-2.0
// ClientSegment: a client's shared memory file (LMCache's L1 pool in
// /dev/shm) that the gateway maps so it can read the card straight into the
// client's load buffers, with no ring copy (protocol r3, docs/protocol.md
// "Segments"). The client passes the file's fd; the gateway maps exactly
// the size fstat reports. One mapping per file serves every connection that
// registered it (each proved access with its own fd), so a page is faulted
// into the gateway once, not once per connection.
//
// Unlike the ring, the file cannot be sealed (LMCache created it), so the
// client may shrink it under the gateway. Touching a page past the new end
// would raise SIGBUS: a process-wide handler catches faults inside any
// mapped segment, maps anonymous memory over the rest of that segment (so
// the access completes, harmlessly) and marks it broken. The request fails
// and the connection is closed; other clients never notice. Faults anywhere
// else keep their previous disposition.
#pragma once

#include <cstdint>
#include <memory>

#include "util/status.h"

namespace adp::proto {

struct SegmentMapping;

class ClientSegment {
 public:
  // Takes over fd. Checks that it is a regular file of exactly `bytes`.
  static Status Attach(int fd, uint64_t bytes, std::unique_ptr<ClientSegment>* out);
  ~ClientSegment();

  uint8_t* data() const;
  uint64_t size() const;
  bool contains(uint64_t offset, uint64_t len) const { return offset <= size() && len <= size() - offset; }
  // Maps [offset, offset + len) into the gateway's page tables in one call
  // (MADV_POPULATE_WRITE), once per 4 KiB page: a copy into it then takes no
  // page fault per 4 KiB, and a range populated before costs no system call
  // (the call costs about as much as the copy of a small object: 11 us for
  // 64 KiB on the 2-CPU VM). Best effort; true when it made the call. Where
  // the kernel refuses the call (before Linux 5.14) no segment of this
  // process makes it (util/populate.h: asked once, logged once).
  bool prepare(uint64_t offset, uint64_t len);
  // True once an access faulted because the client shrank the file.
  bool broken() const;

 private:
  explicit ClientSegment(std::shared_ptr<SegmentMapping> m) : m_(std::move(m)) {}
  std::shared_ptr<SegmentMapping> m_;
};

}  // namespace adp::proto
