// SPDX-License-Identifier: Apache-2.0
// SharedRing: the shared memory a local client and the gateway both map, so
// payload bytes never cross the Unix socket. The client creates it (a sealed
// memfd of ring_bytes), passes the fd in its Hello (SCM_RIGHTS) and the
// gateway maps the same pages. A connection has one request in flight, so
// each request lays its objects out from the start of the ring at 4 KiB
// aligned offsets (the card store then writes from it without staging); a
// batch larger than the ring goes in several rounds. The client maps its
// payload area plus one page (proto::ring_map_bytes, r12): the control page,
// where segments, ring progress or process memory are in use, is that first
// page, and the payload area after it keeps the size the client asked for.
//
// Seals (no shrink, no grow) keep a client from truncating the memory under
// the gateway, which would otherwise fault on access.
#pragma once

#include <cstdint>
#include <memory>

#include "util/status.h"

namespace adp::proto {

constexpr uint64_t kRingAlign = 4096;

class SharedRing {
 public:
  // Client side: a new sealed memfd of `bytes` (the mapping: ring_map_bytes of
  // the payload area), mapped (pages allocated on first use).
  static Status Create(uint64_t bytes, std::unique_ptr<SharedRing>* out);
  // Gateway side: maps the client's fd (taken over) after checking that it is
  // a sealed memfd of exactly `bytes`.
  static Status Attach(int fd, uint64_t bytes, std::unique_ptr<SharedRing>* out);
  ~SharedRing();
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  // True if [offset, offset + len) lies inside the ring (overflow-safe).
  bool contains(uint64_t offset, uint64_t len) const { return offset <= size_ && len <= size_ - offset; }

 private:
  static Status Map(int fd, uint64_t bytes, std::unique_ptr<SharedRing>* out);
  SharedRing(int fd, uint8_t* data, uint64_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  uint8_t* data_;
  uint64_t size_;
};

}  // namespace adp::proto
