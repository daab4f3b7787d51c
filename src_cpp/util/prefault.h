// SPDX-License-Identifier: Apache-2.0
// The walk of a background prefault over a file's written extents, shared by
// its two users: a tmpfs card's mapping (CardDevice::start_prefault, with
// MADV_POPULATE_READ) and a client segment's (proto::SegmentPrefaulter, with
// MADV_POPULATE_WRITE as a load's prepare() makes it). Holes are skipped, so
// the walk's caller allocates no page of the file: it costs page tables
// only (about 2 MiB a GiB of written extents).
#pragma once

#include <cstdint>
#include <functional>

namespace adp {

// One madvise of a prefault: the longest a stop waits for it (about 2 ms on
// the 2-CPU VM at ~110 ms a GiB).
constexpr uint64_t kPrefaultPieceBytes = 16ull << 20;
// A card's prefault goes in smaller pieces (CardDevice::start_prefault): a
// store or load that begins while one is under way meets at most this much
// of it (~0.3-0.6 ms here).
constexpr uint64_t kCardPrefaultPieceBytes = 4ull << 20;

struct ExtentWalk {
  enum class End { kDone, kStopped, kSeekFailed };
  End end = End::kDone;
  uint64_t at = 0;  // kSeekFailed: the offset past which the extents could not be found
  int err = 0;      // kSeekFailed: errno of lseek
};

// Calls piece(offset, n) for the written extents of `fd` within [0, size)
// (lseek SEEK_DATA / SEEK_HOLE; tmpfs reports whole pages), in order, in
// pieces of at most kPrefaultPieceBytes: kDone after the last, kStopped as
// soon as piece returns false. Uses fd's file offset (lseek): nothing else
// may read or write through fd meanwhile. That offset belongs to the open
// file description, which a descriptor passed by SCM_RIGHTS shares with the
// process that sent it: a client segment's walk moves its client's offset
// too (harmless to the connector, which maps its pool and never read(2)s
// it; a client that read(2)s or write(2)s the file it registered would see
// its offset moved).
ExtentWalk walk_written_extents(int fd, uint64_t size, const std::function<bool(uint64_t offset, uint64_t n)>& piece);

// The same walk for a tmpfs or ramfs file mapped whole (MAP_SHARED) at `map`
// (page-aligned; a card's image): calls piece(offset, n) for the runs of its
// pages within [0, size) that hold data, in order, each within one window of
// `window` bytes (whole pages). Holes are jumped over with lseek SEEK_DATA (cheap:
// the page cache's empty nodes are skipped); within a window the data pages
// are those mincore() finds in the page cache. It never asks SEEK_HOLE:
// tmpfs answers that by walking the page cache page by page to the extent's
// end with the file's inode lock held (54 ms from offset 1 MiB of a full
// 8 GiB card image here), and every pwrite of the file (a store's header, a
// pad) waits for that lock. So each call the walk makes holds the inode lock
// for at most the SEEK_DATA's look, and the mapping's lock (mincore) for at
// most one window. A page that is data but not in the page cache (swapped
// out) is left out, as are pages past the last whole page within size.
// kSeekFailed also when mincore fails (err its errno). Uses fd's file offset
// as walk_written_extents does.
ExtentWalk walk_resident_pages(int fd, const uint8_t* map, uint64_t size, uint64_t window,
                               const std::function<bool(uint64_t offset, uint64_t n)>& piece);

}  // namespace adp
