// SPDX-License-Identifier: Apache-2.0
// ClientSegment: a client's shared memory file (LMCache's L1 pool in
// /dev/shm) that the gateway maps so it can read the card straight into the
// client's load buffers, with no ring copy (protocol r3, docs/protocol.md
// "Segments"). The client passes the file's fd; the gateway maps exactly
// the size fstat reports.
//
// Unlike the ring, the file cannot be sealed (LMCache created it), so the
// client may shrink it under the gateway. Touching a page past the new end
// would raise SIGBUS: a process-wide handler catches faults inside any
// mapped segment, maps anonymous memory over the rest of that segment (so
// the access completes, harmlessly) and marks the segment broken. The
// request fails and the connection is closed; other clients never notice.
// Faults anywhere else keep their previous disposition.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "util/status.h"

namespace adp::proto {

class ClientSegment {
 public:
  // Takes over fd. Checks that it is a regular file of exactly `bytes`.
  static Status Attach(int fd, uint64_t bytes, std::unique_ptr<ClientSegment>* out);
  ~ClientSegment();
  ClientSegment(const ClientSegment&) = delete;
  ClientSegment& operator=(const ClientSegment&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool contains(uint64_t offset, uint64_t len) const { return offset <= size_ && len <= size_ - offset; }
  // True once an access faulted because the client shrank the file.
  bool broken() const;

 private:
  ClientSegment(int fd, uint8_t* data, uint64_t size, int slot) : fd_(fd), data_(data), size_(size), slot_(slot) {}
  int fd_;
  uint8_t* data_;
  uint64_t size_;
  int slot_;  // in the fault handler's table
};

}  // namespace adp::proto
