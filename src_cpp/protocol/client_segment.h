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

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "protocol/frame.h"
#include "util/status.h"

namespace adp::proto {

struct SegmentMapping;

// The longest a refusal of segment_fs_refusal is: the Error frame's limit (kMaxMessageBytes, 256), so that the frame
// and the gateway's log line of it (ClientHandler::refuse, as long) carry it whole.
constexpr size_t kSegmentReasonBytes = kMaxMessageBytes;

// Why a segment file at `path` on a mount of filesystem type `type` (its name in /proc/self/mountinfo: "tmpfs",
// "nfs4", "fuse.sshfs"; read without asking the filesystem) is not mapped, or "" where it may be: "segment not
// mapped: " first, then the kind of file, the type and the path, at most kSegmentReasonBytes (a long path cut in
// the middle). ClientSegment::Attach's check (not_mappable), by name so that tests inject the type
// (tests/cpp/segment_fs_test.cc).
std::string segment_fs_refusal(std::string_view type, std::string_view path);

class ClientSegment {
 public:
  // Takes over fd. Checks that it is a regular file of exactly `bytes`. A new mapping (not one another connection
  // made of the same file) is refused where the mappings of this process would pass max_total_bytes (address
  // space, --max-segment-total-gb). Refusals that are about this process's state, not the file (that cap, mmap's
  // ENOMEM, the fault handler's table full, no memory), are Busy with a reason starting with kSegmentRetryLater
  // (protocol r19); those about the file are InvalidArgument.
  static Status Attach(int fd, uint64_t bytes, uint64_t max_total_bytes, std::unique_ptr<ClientSegment>* out);
  static Status Attach(int fd, uint64_t bytes, std::unique_ptr<ClientSegment>* out) {
    return Attach(fd, bytes, UINT64_MAX, out);
  }
  // The bytes of this process's segment mappings (each counted once): segment_bytes in StatsReply.
  static uint64_t mapped_bytes();
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
  friend class SegmentPrefaulter;
  explicit ClientSegment(std::shared_ptr<SegmentMapping> m) : m_(std::move(m)) {}
  std::shared_ptr<SegmentMapping> m_;
};

// Populates registered segments' page tables in the background, so that the
// first load into each page pays no MADV_POPULATE_WRITE (issue 10 item 2:
// ~220 us a 2 MiB object on the 2-CPU VM). Only a segment on a memory
// filesystem (tmpfs, hugetlbfs, ramfs: fstatfs at Attach): a write fault on a
// disk-backed file's page dirties it, so populating one would write the
// whole file back and move its mtime with no load asked for (review r15
// N10); those are left to the loads, with a DEBUG line. One thread
// (adp-segpopulate, started at the first add), segments in the order added, each over its
// written pages only (util/prefault.h: a hole is left to the load that
// allocates it, so the client's file takes no memory it did not), in pieces
// of kPrefaultPieceBytes, each made as prepare() makes it and marked, so a
// load into it skips the call; a load that comes first prepares its own
// range at once, as without it. It holds the mapping while it works on it
// (no unmap under it) and gives it up, leaving the rest, within one piece
// once every connection released the segment, the segment broke, or stop()
// was called. Where the kernel refuses the call (util/populate.h) it does
// nothing, and logs nothing more than the refusal's one line. Thread-safe.
class SegmentPrefaulter {
 public:
  SegmentPrefaulter() = default;
  ~SegmentPrefaulter() { stop(); }
  SegmentPrefaulter(const SegmentPrefaulter&) = delete;
  SegmentPrefaulter& operator=(const SegmentPrefaulter&) = delete;

  // Queues the segment's mapping (not a reference to it: a segment released
  // before its turn is skipped); one already queued or gone over is not
  // queued again (another connection's registration of the same file), nor
  // one not on a memory filesystem. Never blocks on the populate. Nothing
  // after stop().
  void add(const ClientSegment& seg);
  // Stops the thread within one piece and joins it; idempotent.
  void stop();

  // Bytes populated here, the wall time of those calls, and the segments
  // gone over to their end.
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  uint64_t ns() const { return ns_.load(std::memory_order_relaxed); }
  uint64_t segments_done() const { return done_.load(std::memory_order_relaxed); }
  // Segments queued or being gone over now: 0 once every segment added was
  // finished with (done, let go, or refused by the kernel), so a reader that
  // waits for 0 sees their whole outcome in the counters and the log.
  uint64_t pending() const { return pending_.load(std::memory_order_acquire); }

  // Tests only: called before each piece with its offset in the segment
  // (after the piece's look at stop(): a hook that waits for stop_requested()
  // lets that piece be made, and no later one).
  std::function<void(uint64_t offset)> before_piece_for_test;
  bool stop_requested() const { return stop_.load(std::memory_order_relaxed); }

 private:
  void run();
  void populate(const std::shared_ptr<SegmentMapping>& m);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::weak_ptr<SegmentMapping>> queue_;
  bool stopping_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::atomic<uint64_t> bytes_{0}, ns_{0}, done_{0}, pending_{0};
};

}  // namespace adp::proto
