// SPDX-License-Identifier: Apache-2.0
// CardDevice: the card as a file descriptor opened with O_DIRECT, either a
// block device or an image file (created when missing), read-write or
// read-only. Holds an exclusive flock for its lifetime either way, so a card
// has one owner at a time.
// I/O calls are thread-safe (positional), and must use 4 KiB-aligned offsets,
// lengths and memory: the card never enters the host page cache. An image on
// tmpfs is also mapped, and its written extents are mapped in ahead of use on
// a background thread (start_prefault).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "store/device.h"
#include "util/failing_hold.h"
#include "util/group_sync.h"
#include "util/io_slots.h"
#include "util/status.h"

namespace adp {

// What a card image file can still take from its filesystem, against what
// that filesystem has free: the one rule behind refusing a new image at
// creation (CardDevice::Open) and the WARNING at the open of an existing one
// (card_space_warning; the gateway and the embedded connector log it). A
// sparse image takes its blocks as they are first written, so what counts is
// what it can still grow by (its size less its allocated blocks), not its
// size. docs/card_format.md, "Free space".
struct CardSpace {
  uint64_t size = 0;       // the image's bytes (the size asked for, in whole blocks, for one not made yet)
  uint64_t allocated = 0;  // the blocks its filesystem holds for it: st_blocks x 512 (0 for one not made yet)
  uint64_t free = 0;       // what an unprivileged writer may still allocate there: f_bavail x f_frsize
  // Where the filesystem was asked: the image, or (not made yet) the nearest
  // existing directory above it.
  std::string at;
  bool read_only = false;  // that filesystem is mounted read-only (ST_RDONLY): nothing is made or written there
  // It reports its size (f_blocks > 0). A pseudo filesystem (sysfs, procfs)
  // or a tmpfs of size=0 (no limit) reports 0 blocks and 0 free: no rule on
  // space applies there (audit 15 item 11: "/sys/x/card.img" was refused as
  // "0 bytes free"; making it gives the real reason).
  bool reports_size = true;
  // The other card images (block 0 begins with the card magic) that are
  // regular files in the same directory, on the same filesystem, and can
  // still grow: several cards that each fit alone may not fit together.
  // Images elsewhere on that filesystem (another directory, another
  // process's) are not seen.
  struct Other {
    std::string path;
    uint64_t size, allocated;
    uint64_t grows_by() const { return size > allocated ? size - allocated : 0; }
  };
  std::vector<Other> others;
  uint64_t grows_by() const { return size > allocated ? size - allocated : 0; }
  uint64_t others_grow_by() const;
};

// Looks at the card image `path` (a symlink is followed: the image's own file,
// filesystem and directory count) or, when it does not exist, at the image of
// `create_bytes` that would be made there (the nearest existing directory
// above it gives the filesystem). False for a block device or anything that
// cannot be looked at (a missing path with create_bytes 0 too): no rule
// applies then. `others` is filled only with see_others (a directory read).
bool look_at_card_space(const std::string& path, uint64_t create_bytes, CardSpace* out, bool see_others);

// The WARNING for an existing image `path` whose filesystem cannot hold what
// it can still grow by, alone ("card image X is N GiB (sparse: W GiB
// written) but its filesystem has F GiB free: ...") or together with the
// other card images beside it ("card image X can grow by ... together that
// is more than ..."); empty when it fits or no rule applies.
std::string card_space_warning(const std::string& path);

// For tests: the longest a card's prefault waits before a piece while the
// card's own I/O is in flight (kPrefaultYield, 20 ms, otherwise), for every
// card of this process from now on.
void set_card_prefault_yield_for_test(std::chrono::milliseconds yield);

class CardDevice : public Device {
 public:
  // kReadOnly (status, verify without --repair): O_RDONLY, so that a card on
  // a filesystem the kernel remounted read-only, or an image the caller may
  // not write, can still be read; nothing is created, writev refuses.
  enum class Access { kReadWrite, kReadOnly };
  // How a new image file gets its size: kSparse (the default), ftruncate: its
  // filesystem allocates the blocks as stores first write them; kAllocated
  // (asked for: card_preallocate), its blocks allocated at once (fallocate:
  // the space is the card's from the start, no ENOSPC later while the card
  // has room; first-fill stores on ext4 1.05-1.39x, but loads right after
  // that fill 0.88-0.90x of a sparse image here,
  // benchmarks/results/2026-12-04-1930-prealloc.md), except on tmpfs/ramfs
  // and on a filesystem without fallocate, where it stays sparse
  // (store/new_image.h). An existing image is never allocated at open.
  enum class Creation { kAllocated, kSparse };
  // Opens `path`. A missing file is created with `create_bytes` if
  // create_bytes > 0 and access is kReadWrite (`creation`; NoSpace, nothing
  // left behind, when its filesystem cannot hold it); otherwise a missing
  // card is NotFound. Busy if another open description holds the card.
  static Status Open(const std::string& path, uint64_t create_bytes, std::unique_ptr<CardDevice>* out,
                     Access access = Access::kReadWrite, Creation creation = Creation::kSparse);
  ~CardDevice() override;

  const std::string& path() const override { return path_; }
  uint64_t size() const override { return size_; }
  bool is_block_device() const { return block_device_; }
  bool read_only() const { return read_only_; }
  // True for an image file on tmpfs or ramfs: its I/O is a memory copy.
  bool memory_backed() const override { return memory_backed_; }
  // A memory-backed image is mapped (MAP_SHARED: the mapping is the tmpfs
  // page cache, which is the card itself, so pwrite and the mapping see each
  // other's writes at once); nullptr for other cards or when mapping failed.
  uint8_t* mapped() const override { return map_; }
  bool prepare_mapped_write(uint64_t offset, size_t n) const override;
  // Maps the image's written extents (lseek SEEK_DATA/SEEK_HOLE) into the
  // mapping on a thread of its own (adp-prefault), kPrefaultPieceBytes per
  // madvise(MADV_POPULATE_READ) (util/prefault.h), so that the first pass of loads over a card
  // written by another process does not take a page fault per page. Holes
  // are skipped: no tmpfs page is allocated. A no-op without a mapping (disk
  // cards), when already started, or with ADP_CARD_PREFAULT=0 in the
  // environment. The destructor stops it (stop_prefault). CardStore::Open
  // calls it once its open is done: a write to the image (recovery's pads)
  // waits behind it.
  //
  // It finds the written pages without SEEK_HOLE (util/prefault.h,
  // walk_resident_pages): tmpfs's SEEK_HOLE held the image's inode lock over
  // a scan of the whole extent, 54 ms from 1 MiB of a full 8 GiB card, and
  // every pwritev of the card (a store's header, a pad) waited for it.
  // It goes in pieces of kCardPrefaultPieceBytes and, before each, waits
  // while a store, load or delete of the card is in flight
  // (begin_foreground), up to kPrefaultYield (20 ms) each time: such an
  // operation meets at most one piece under way, and does not share the
  // kernel (page allocation, the LRU) and the CPUs with the prefault for
  // longer; under a steady load the prefault still goes on, a piece at
  // least every kPrefaultYield.
  void start_prefault();
  // Stops the prefault thread within one step and joins it; idempotent.
  void stop_prefault();
  void stop_background() override { stop_prefault(); }
  [[nodiscard]] Foreground begin_foreground() const override { return Foreground(foreground_); }
  // True once the prefault thread has gone over every extent (false while it
  // runs, when it was stopped or failed, or never started).
  bool prefault_done() const { return prefault_done_.load(std::memory_order_acquire); }

  Status readv(uint64_t offset, const iovec* iov, int count) const override;
  // InvalidArgument, nothing written, on a card opened kReadOnly.
  Status writev(uint64_t offset, const iovec* iov, int count) const override;
  // Makes completed writes durable against power loss (fdatasync). Callers
  // share fdatasyncs (group commit, util/group_sync.h): each is answered by
  // one that began after every write completed before its call, and fails
  // where a failed one may have lost a write issued after `since`.
  Status sync(uint64_t since) const override;
  // A disk card's writer issues its write with Linux native AIO (raw io_setup/io_submit/io_getevents; Docker's
  // default seccomp allows them, and blocks io_uring), one AIO context for the writer's life, never one a write: its
  // thread prepares the next store while the write is in flight (CardStore::put_each). The write takes one of the
  // card's I/O slots (set_io_depth) and counts as issued (write_mark) at submit, as completed at wait, as a
  // synchronous write does around its syscall. Where io_setup fails (ENOSYS, EAGAIN from fs.aio-max-nr, seccomp),
  // and for a memory-backed or read-only card, a SyncDeviceWriter (the failure logged once a process); where one
  // io_submit fails, that write is made synchronously.
  std::unique_ptr<DeviceWriter> make_writer() const override;
  uint64_t write_mark() const override { return group_sync_.mark(); }
  bool lost_after(uint64_t since) const override { return group_sync_.lost_after(since); }
  // Bounds the card I/O in flight at once (the card's queue depth): threads
  // beyond it check and copy data while others wait on the card. Call before
  // the device is shared between threads.
  void set_io_depth(int depth);
  // False from an I/O error until an I/O succeeds kFailingHold after the
  // last error (util/failing_hold.h): each episode logged once at its start
  // and once at its end, however errors and successes interleave.
  bool healthy() const override { return !failing_.failing(); }
  // From now on, a child fork() makes keeps nothing of the card: its descriptor refers to nothing there and its
  // mapping (a memory card's) is gone from it (util/fork_owner.h, fork_release), so the card's flock is held by this
  // process alone (fork40: a forked child kept it while it lived). For an owner that refuses its work in a forked
  // child (the connector, the binding's CardStore: CardOptions::release_in_forked_child); any I/O of a child on the
  // card then fails EBADF. Call before the device is shared between threads; idempotent.
  void release_in_forked_child();

 private:
  CardDevice(std::string path, int fd, uint64_t size, bool block_device, bool memory_backed, bool read_only)
      : path_(std::move(path)),
        fd_(fd),
        size_(size),
        block_device_(block_device),
        memory_backed_(memory_backed),
        read_only_(read_only) {}
  class AioWriter;
  Status transfer(bool is_write, uint64_t offset, const iovec* iov, int count) const;
  // A failed read or write of `bytes` at `offset` (errno `e`).
  Status io_error(bool is_write, uint64_t bytes, uint64_t offset, int e) const;
  void prefault_extents();  // the adp-prefault thread
  Status track(Status s) const;

  std::string path_;
  int fd_;
  uint64_t size_;
  bool block_device_;
  bool memory_backed_;
  bool read_only_;
  uint8_t* map_ = nullptr;
  bool fork_released_ = false;  // release_in_forked_child() registered fd_ (and map_)
  std::thread prefault_;
  std::atomic<bool> stop_prefault_{false}, prefault_done_{false};
  // Stores, loads, deletes in flight (begin_foreground): shared with each
  // one's Foreground, which may end after this device is freed.
  const std::shared_ptr<std::atomic<int>> foreground_ = std::make_shared<std::atomic<int>>(0);
  mutable FailingHold failing_;
  mutable GroupSync group_sync_{path_};  // after path_: it is made from it
  static constexpr int kMaxIoDepth = 256;
  mutable IoSlots io_slots_{kMaxIoDepth};  // set_io_depth keeps `depth` of them free (util/io_slots.h)
};

}  // namespace adp
