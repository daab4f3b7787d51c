// SPDX-License-Identifier: Apache-2.0
#include "store/card_device.h"

#include <fcntl.h>
#include <linux/aio_abi.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "store/card_format.h"
#include "store/new_image.h"
#include "util/amount.h"
#include "util/fork_owner.h"
#include "util/log.h"
#include "util/populate.h"
#include "util/prefault.h"
#include "util/scope_exit.h"
#include "util/thread_name.h"

namespace adp {

namespace {

// Whether the regular file `path` is a card image: block 0 begins with the card's superblock magic (any format
// version: an older card grows as well), or a card opens it through its backup superblock (session 39: block 0
// unreadable, blank or torn beside a valid backup at 1 MiB - 4 KiB; sbfix40: such a card was not counted).
bool is_card_image(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  uint8_t block0[kBlockSize], backup[kBlockSize];
  const ssize_t got = ::pread(fd, block0, sizeof block0, 0);
  bool card = got >= ssize_t(sizeof kSuperMagic) && std::memcmp(block0, kSuperMagic, sizeof kSuperMagic) == 0;
  if (!card && (got < 0 || got == ssize_t(sizeof block0)) &&
      ::pread(fd, backup, sizeof backup, off_t(kBackupSuperblockOffset)) == ssize_t(sizeof backup)) {
    Superblock sb{};
    std::memcpy(&sb, backup, sizeof sb);
    card = valid_superblock(sb) && opens_with_backup(got >= 0, block0);
  }
  ::close(fd);
  return card;
}

// The card images in `dir` on filesystem `dev` that can still grow, but the
// one with inode `self` (0: none), by path.
std::vector<CardSpace::Other> other_images(const std::filesystem::path& dir, dev_t dev, ino_t self) {
  std::vector<CardSpace::Other> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string p = it->path().string();
    struct stat st{};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != dev || st.st_ino == self) continue;
    CardSpace::Other o{p, uint64_t(st.st_size), uint64_t(st.st_blocks) * 512};
    if (o.grows_by() > 0 && is_card_image(p)) out.push_back(std::move(o));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return out;
}

}  // namespace

uint64_t CardSpace::others_grow_by() const {
  uint64_t n = 0;
  for (const Other& o : others) n += o.grows_by();
  return n;
}

bool look_at_card_space(const std::string& path, uint64_t create_bytes, CardSpace* out, bool see_others) {
  *out = CardSpace{};
  std::error_code ec;
  std::filesystem::path dir;
  struct stat st{};
  struct statvfs vfs{};
  ino_t self = 0;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode) || ::statvfs(path.c_str(), &vfs) != 0) return false;
    out->at = path;
    out->size = uint64_t(st.st_size);
    out->allocated = uint64_t(st.st_blocks) * 512;
    self = st.st_ino;
    if (see_others) dir = std::filesystem::canonical(path, ec).parent_path();
  } else {
    if (errno != ENOENT || create_bytes == 0) return false;
    out->size = create_bytes & ~(kBlockSize - 1);
    dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) dir = ".";
    while (!std::filesystem::exists(dir, ec) && dir.has_parent_path() && dir != dir.parent_path())
      dir = dir.parent_path();
    if (::stat(dir.c_str(), &st) != 0 || ::statvfs(dir.c_str(), &vfs) != 0) return false;
    out->at = dir.string();
  }
  out->free = uint64_t(vfs.f_bavail) * vfs.f_frsize;
  out->read_only = vfs.f_flag & ST_RDONLY;
  out->reports_size = vfs.f_blocks > 0;
  if (see_others && !ec && !dir.empty()) out->others = other_images(dir, st.st_dev, self);
  return true;
}

std::string card_space_warning(const std::string& path) {
  CardSpace s;
  if (!look_at_card_space(path, 0, &s, true) || !s.reports_size) return "";
  if (s.grows_by() > s.free)
    return "card image " + path + " is " + log_amount(s.size) + " (sparse: " + log_amount(s.allocated) +
           " written) but its filesystem has " + log_amount(s.free) +
           " free: once that is used, stores fail with 'No space left on device' and the card does not evict for it; "
           "make room, or remove the image and start with a size that fits (the size applies when an image is "
           "created)";
  const uint64_t others = s.others_grow_by();
  if (others == 0 || s.grows_by() + others <= s.free) return "";
  constexpr size_t kNamed = 8;
  std::string named;
  for (size_t i = 0; i < s.others.size() && i < kNamed; i++)
    named += (i ? ", " : "") + s.others[i].path + " " + log_amount(s.others[i].grows_by());
  if (s.others.size() > kNamed) named += ", and " + std::to_string(s.others.size() - kNamed) + " more";
  const size_t n = s.others.size();
  return "card image " + path + " can still grow by " + log_amount(s.grows_by()) +
         " (its size less what is written) and " + std::to_string(n) + " other card image" + (n == 1 ? "" : "s") +
         " beside it by " + log_amount(others) + " (" + named + "): together more than the " + log_amount(s.free) +
         " its filesystem has free; each fits alone, not all together: once the filesystem is full, stores of every "
         "card there fail with 'No space left on device' and none evicts for it; make room, remove the images no "
         "card uses, or give the cards sizes that fit together (the size applies when an image is created)";
}

Status CardDevice::Open(const std::string& path, uint64_t create_bytes, std::unique_ptr<CardDevice>* out, Access access,
                        Creation creation) {
  const bool read_only = access == Access::kReadOnly;
  struct stat st{};
  bool exists = ::stat(path.c_str(), &st) == 0;
  CardSpace space;                               // a new image's filesystem, as seen before it is made
  std::vector<std::filesystem::path> made_dirs;  // directories made for a new image
  if (!exists && errno != ENOENT) return Status::IoError("cannot stat card " + path + ": " + errno_text(errno));
  if (!exists && (create_bytes == 0 || read_only)) return Status::NotFound("card " + path + " does not exist");
  if (exists && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
    return Status::InvalidArgument("card " + path + " is neither a regular file nor a block device");

  // flock() takes its exclusive lock on a read-only descriptor too: a
  // read-only open still keeps a gateway or a connector off the card.
  int flags = (read_only ? O_RDONLY : O_RDWR) | O_DIRECT | O_CLOEXEC;
  if (!exists) {
    // An image larger than its filesystem's free space is refused before
    // anything (a directory, the file) is made: a sparse one would start and
    // then fail its stores with ENOSPC once the filesystem fills. (One that
    // passes here can still fail its allocation: size_new_image, NoSpace.)
    // (Only this image counts: the others beside it are the WARNING's, see
    // card_space_warning and docs/card_format.md.)
    // One on a read-only filesystem is refused as that, whatever free space it
    // reports (a squashfs or ISO image reports none: audit 15 item 11).
    const bool looked = look_at_card_space(path, create_bytes, &space, false);
    const CardSpace& s = space;
    if (looked && s.read_only)
      return Status::IoError("cannot create card image " + path + ": " + s.at + " is on a read-only filesystem");
    if (looked && s.reports_size && s.grows_by() > s.free)
      return Status::NoSpace("cannot create card image " + path + " of " + log_amount(s.size) + " (" +
                             std::to_string(s.size) + " bytes): its filesystem has " + log_amount(s.free) + " (" +
                             std::to_string(s.free) + " bytes) free; give a size that fits or make room");
    std::error_code ec;
    auto parent = std::filesystem::path(path).parent_path();
    // The directories this creation makes, deepest first: removed again (if
    // still empty) when the image cannot be made after all.
    for (auto d = parent; !d.empty() && d != d.parent_path() && !std::filesystem::exists(d, ec); d = d.parent_path())
      made_dirs.push_back(d);
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    // The card named (review33c C5: "cannot create directory /proc/nope: ..." said not what it was for).
    if (ec)
      return Status::IoError("cannot create directory " + parent.string() + " for card image " + path + ": " +
                             ec.message());
    flags |= O_CREAT | O_EXCL;
  }
  // Removes what this creation made (the image, then its new directories).
  auto unmake = [&](int fd) {
    ::close(fd);
    ::unlink(path.c_str());
    std::error_code ec;
    for (const auto& d : made_dirs) std::filesystem::remove(d, ec);
  };
  bool is_blk = exists && S_ISBLK(st.st_mode);
  if (is_blk) flags |= O_EXCL;  // exclusive claim of the device against mounts and other O_EXCL openers

  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) {
    int e = errno;
    if (e == EINVAL) return Status::InvalidArgument("the filesystem of " + path + " does not support O_DIRECT");
    if (e == EBUSY) return Status::Busy("block device " + path + " is in use (mounted or opened exclusively)");
    if (e == EEXIST) return Status::Busy("card " + path + " was created concurrently by another process");
    return Status::IoError("cannot open card " + path + ": " + errno_text(e));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    ::close(fd);
    if (e == EWOULDBLOCK)
      return Status::Busy("card " + path +
                          " is already open by another connector or gateway; a card has one owner "
                          "(share it through `lmcache-adp gateway`)");
    return Status::IoError("cannot lock card " + path + ": " + errno_text(e));
  }

  uint64_t size = 0;
  if (is_blk) {
    if (::ioctl(fd, BLKGETSIZE64, &size) != 0) {
      int e = errno;
      ::close(fd);
      return Status::IoError("cannot read size of block device " + path + ": " + errno_text(e));
    }
  }
  struct statfs fs{};
  bool memory = !is_blk && ::fstatfs(fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
  if (!is_blk && !exists) {
    create_bytes &= ~(kBlockSize - 1);
    NewImage made;
    Status sized = size_new_image(fd, path, create_bytes, creation == Creation::kSparse, memory, space.free, &made);
    if (!sized.ok()) {
      unmake(fd);
      return sized;
    }
    size = create_bytes;
    ADP_INFO("created card image %s (%s, %s)", path.c_str(), log_amount(size).c_str(), made.how.c_str());
  } else if (!is_blk) {
    size = static_cast<uint64_t>(st.st_size);
  }
  out->reset(new CardDevice(path, fd, size, is_blk, memory, read_only));
  if (memory && size > 0) {
    // Reads only touch blocks that were written, and writes blocks that
    // prepare_mapped_write() allocated, so the mapping never faults on a hole
    // (which on a full tmpfs would be SIGBUS, not an error).
    void* m = ::mmap(nullptr, size, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
      ADP_WARN("card %s: cannot map the image (%s); loads read it with preadv", path.c_str(),
               errno_text(errno).c_str());
    else
      (*out)->map_ = static_cast<uint8_t*>(m);
  }
  return Status::Ok();
}

bool CardDevice::prepare_mapped_write(uint64_t offset, size_t n) const {
  if (!map_ || read_only_ || offset % kBlockSize || n % kBlockSize || offset + n > size_) return false;
  // Allocates what is a hole and maps every page writable in one call: an
  // error (EFAULT for a full tmpfs) instead of a SIGBUS in the copy. False
  // without a system call where this kernel refuses it (before Linux 5.14:
  // util/populate.h): the store is then written with writev.
  return populate_write(map_ + offset, n);
}

namespace {
// How long the prefault leaves the kernel to the card's own I/O before each
// piece at most (set_card_prefault_yield_for_test), and how often it looks
// meanwhile (also how soon a stop is seen then).
std::atomic<std::chrono::milliseconds> prefault_yield{std::chrono::milliseconds(20)};
constexpr auto kPrefaultYieldPoll = std::chrono::microseconds(100);
}  // namespace

void set_card_prefault_yield_for_test(std::chrono::milliseconds yield) { prefault_yield.store(yield); }

void CardDevice::start_prefault() {
  if (!map_ || prefault_.joinable() || stop_prefault_.load(std::memory_order_relaxed)) return;
  if (const char* v = std::getenv("ADP_CARD_PREFAULT"); v && std::string(v) == "0") return;
  try {
    prefault_ = std::thread([this] {
      // Session 29: an exception here (std::bad_alloc: the walk's window, a log line's amount) ended the process
      // (std::terminate on this thread: the gateway, at its card's open). Loads fault the pages in themselves.
      try {
        prefault_extents();
      } catch (const std::exception& e) {
        ADP_ERROR(
            "card %s: mapping its written extents in ahead stopped on an exception (%s); loads fault its pages in "
            "as they read them",
            path_.c_str(), e.what());
      }
    });
  } catch (const std::exception& e) {
    // No thread (std::system_error: a pids limit, memory; std::bad_alloc: its state): loads and stores fault their
    // pages in themselves. Thrown, the exception ended the process (the gateway) or failed the card's open.
    ADP_WARN("card %s: no thread to map its written extents in ahead (%s); loads fault its pages in as they read them",
             path_.c_str(), e.what());
  }
}

void CardDevice::prefault_extents() {
  set_thread_name("adp-prefault");
  // MADV_POPULATE_READ came with Linux 5.14, as MADV_POPULATE_WRITE did: a
  // kernel that refuses one refuses both (EINVAL at the first extent, which
  // said only "Invalid argument").
  if (populate_refused(map_)) {
    ADP_INFO(
        "card %s: its written extents are not mapped in ahead: this kernel does not have MADV_POPULATE_READ "
        "(Linux before 5.14); loads fault its pages in as they read them instead",
        path_.c_str());
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  uint64_t mapped = 0;
  const ExtentWalk w = walk_resident_pages(fd_, map_, size_, kCardPrefaultPieceBytes, [&](uint64_t p, uint64_t n) {
    // The card's own I/O first: while a store, load or delete is in flight,
    // wait (polled) up to the yield, then a piece all the same.
    const auto give_up = std::chrono::steady_clock::now() + prefault_yield.load(std::memory_order_relaxed);
    while (foreground_->load(std::memory_order_relaxed) > 0 && !stop_prefault_.load(std::memory_order_relaxed) &&
           std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(kPrefaultYieldPoll);
    if (stop_prefault_.load(std::memory_order_relaxed)) return false;
    // A read fault on a written tmpfs page maps it, writable (tmpfs asks
    // for no write notification: later stores into it take no fault
    // either), and allocates nothing.
    int rc;
    do rc = ::madvise(map_ + p, n, MADV_POPULATE_READ);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      ADP_WARN("card %s: mapping its extents in ahead stopped at offset %llu: %s", path_.c_str(),
               static_cast<unsigned long long>(p), errno_text(errno).c_str());
      return false;
    }
    mapped += n;
    return true;
  });
  if (w.end == ExtentWalk::End::kSeekFailed)
    ADP_WARN("card %s: cannot find its written extents past offset %llu: %s", path_.c_str(),
             static_cast<unsigned long long>(w.at), errno_text(w.err).c_str());
  if (w.end != ExtentWalk::End::kDone) return;
  if (stop_prefault_.load(std::memory_order_relaxed)) return;
  prefault_done_.store(true, std::memory_order_release);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ADP_INFO("card %s: %s of written extents mapped in %.2f s", path_.c_str(), log_amount(mapped).c_str(), s);
}

void CardDevice::stop_prefault() {
  stop_prefault_.store(true, std::memory_order_relaxed);
  if (prefault_.joinable()) prefault_.join();
}

void CardDevice::release_in_forked_child() {
  if (fork_released_) return;
  fork_release(fd_, map_, map_ ? size_ : 0);
  fork_released_ = true;
}

CardDevice::~CardDevice() {
  stop_prefault();                               // before the mapping goes
  if (fork_released_) fork_release_forget(fd_);  // before the number can be another's
  if (map_) ::munmap(map_, size_);
  ::close(fd_);
}

void CardDevice::set_io_depth(int depth) {
  depth = std::clamp(depth, 1, kMaxIoDepth);
  for (int i = depth; i < kMaxIoDepth; i++) io_slots_.acquire();  // keep `depth` slots
}

Status CardDevice::transfer(bool is_write, uint64_t offset, const iovec* iov, int count) const {
  io_slots_.acquire();
  struct Release {
    IoSlots& s;
    ~Release() { s.release(); }
  } release{io_slots_};
  size_t total = 0;
  for (int i = 0; i < count; i++) total += iov[i].iov_len;
  size_t done = 0;
  std::vector<iovec> rest;  // only used after a short transfer (rare)
  const iovec* cur = iov;
  int cur_count = count;
  while (done < total) {
    ssize_t n = is_write ? ::pwritev(fd_, cur, cur_count, static_cast<off_t>(offset + done))
                         : ::preadv(fd_, cur, cur_count, static_cast<off_t>(offset + done));
    if (n < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      return io_error(is_write, total - done, offset + done, e);
    }
    if (n == 0)
      return Status::IoError("unexpected end of card " + path_ + " at offset " + std::to_string(offset + done));
    done += static_cast<size_t>(n);
    if (done == total) break;
    // Short transfer: rebuild the remaining iovecs.
    rest.clear();
    size_t skip = done;
    for (int i = 0; i < count; i++) {
      if (skip >= iov[i].iov_len) {
        skip -= iov[i].iov_len;
        continue;
      }
      rest.push_back({static_cast<char*>(iov[i].iov_base) + skip, iov[i].iov_len - skip});
      skip = 0;
    }
    cur = rest.data();
    cur_count = static_cast<int>(rest.size());
  }
  return Status::Ok();
}

Status CardDevice::io_error(bool is_write, uint64_t bytes, uint64_t offset, int e) const {
  // An image file left sparse allocates its blocks as they are first
  // written: ENOSPC means its filesystem is full, not the card.
  const char* full = e == ENOSPC && !block_device_
                         ? " (the card image's filesystem is full: the image is larger than the space its "
                           "filesystem has left; free space there, or remove the image and start with a size "
                           "that fits)"
                         : "";
  return Status::IoError(std::string(is_write ? "write" : "read") + " of " + std::to_string(bytes) +
                         " bytes at offset " + std::to_string(offset) + " of " + path_ + " failed: " + errno_text(e) +
                         full);
}

// One write in flight at a time through its own AIO context (io_setup(1)), made once for the writer.
class CardDevice::AioWriter : public DeviceWriter {
 public:
  explicit AioWriter(const CardDevice& dev) : dev_(dev) {}
  ~AioWriter() override {
    if (in_flight_) (void)wait();  // the kernel may still read the caller's memory
    if (ctx_ && ::getpid() == pid_) ::syscall(SYS_io_destroy, ctx_);
  }
  // Its AIO context (one write at a time), this process's; errno's value where io_setup failed, else 0.
  int setup() {
    pid_ = ::getpid();
    forks_ = fork_count();
    return ::syscall(SYS_io_setup, 1U, &ctx_) == 0 ? 0 : errno;
  }
  AioWriter(const AioWriter&) = delete;
  AioWriter& operator=(const AioWriter&) = delete;
  bool in_flight() const override { return in_flight_; }

  void submit(uint64_t offset, const iovec* iov, int count) override {
    offset_ = offset;
    iov_.assign(iov, iov + count);  // kept for a short write's rest; capacity reused
    total_ = 0;
    for (int i = 0; i < count; i++) total_ += iov[i].iov_len;
    // An AIO context is its process's: a child forked after io_setup (a DataLoader's worker, multiprocessing's
    // fork) has none, and each io_submit there failed EINVAL before its write was made synchronously (debt38). The
    // child writes synchronously for good, one WARNING a process. Told by the fork count (a relaxed load a write),
    // not getpid() (a syscall a write: 1.3-2.2 us on the 2-core VM, debt38's results; no pid cache in glibc).
    if (ctx_ && fork_count() != forks_) {
      ctx_ = 0;  // the parent's: not destroyed here (it is not this process's to destroy)
      const pid_t me = ::getpid();
      if (forked_logged_.exchange(me) != me)
        ADP_WARN(
            "card %s: this process (pid %d) was forked from the one whose AIO context its stores used (pid %d): "
            "they write synchronously here, their copy and CRC not overlapped with the previous write",
            dev_.path_.c_str(), static_cast<int>(me), static_cast<int>(pid_));
    }
    dev_.group_sync_.issue();  // before the syscall, as writev's
    if (!ctx_) {  // its context destroyed after a failed io_getevents (wait()), or a forked process's: synchronous
      result_ = write_now(offset, iov, count, [] {});
      return;
    }
    dev_.io_slots_.acquire();
    std::memset(&cb_, 0, sizeof cb_);
    cb_.aio_fildes = static_cast<uint32_t>(dev_.fd_);
    cb_.aio_lio_opcode = IOCB_CMD_PWRITEV;
    cb_.aio_buf = reinterpret_cast<uint64_t>(iov_.data());
    cb_.aio_nbytes = static_cast<uint64_t>(count);
    cb_.aio_offset = static_cast<int64_t>(offset);
    iocb* list[1] = {&cb_};
    long r;
    do {
      r = ::syscall(SYS_io_submit, ctx_, 1L, list);
    } while (r < 0 && errno == EINTR);
    if (r == 1) {
      in_flight_ = true;
      return;
    }
    // Not taken (EAGAIN, or a file the kernel cannot write so): this write made synchronously. Its slot given back
    // first, and it is counted completed on every way out: the log line allocates, and a std::bad_alloc there kept
    // the slot for good (review37b: with io_depth 1 every later I/O of the card then waited for it).
    const int e = r < 0 ? errno : EAGAIN;
    dev_.io_slots_.release();
    result_ = write_now(offset, iov, count, [&] {
      if (!submit_failed_logged_.exchange(true))
        ADP_WARN("card %s: io_submit failed (%s): this write, and any other whose io_submit fails, made synchronously",
                 dev_.path_.c_str(), errno_text(e).c_str());
    });
  }

  Status wait() override {
    if (!in_flight_) return std::move(result_);
    in_flight_ = false;
    io_event ev{};
    long r;
    do {
      r = ::syscall(SYS_io_getevents, ctx_, 1L, 1L, &ev, nullptr);
    } while (r < 0 && errno == EINTR);
    const int e = r < 0 ? errno : EIO;
    if (r != 1) {
      // Not reaped: the kernel may still be making the write, from the caller's memory and ctx's staging (soon
      // reused) to the place the store abandons next (its pad could land under it). io_destroy returns once every
      // request of the context has ended; this writer writes synchronously from then on (review37b).
      ::syscall(SYS_io_destroy, ctx_);
      ctx_ = 0;
    }
    dev_.io_slots_.release();
    const ScopeExit completed([this] { dev_.group_sync_.wrote(); });  // a sync from now on covers it
    Status s;
    if (r != 1) {
      if (!getevents_failed_logged_.exchange(true))
        ADP_WARN(
            "card %s: io_getevents failed (%s): a store's write of unknown outcome failed; this writer's AIO "
            "context destroyed, its writes made synchronously",
            dev_.path_.c_str(), errno_text(e).c_str());
      // The write's fate unknown (io_getevents itself failed: not seen): the card is failed for it.
      s = dev_.io_error(true, total_, offset_, e);
    } else if (ev.res < 0) {
      s = dev_.io_error(true, total_, offset_, static_cast<int>(-ev.res));
    } else if (static_cast<uint64_t>(ev.res) < total_) {  // short: the rest synchronously (rare)
      uint64_t skip = static_cast<uint64_t>(ev.res);
      std::vector<iovec> rest;
      for (const iovec& v : iov_) {
        if (skip >= v.iov_len) {
          skip -= v.iov_len;
          continue;
        }
        rest.push_back({static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip});
        skip = 0;
      }
      s = ev.res == 0
              ? Status::IoError("unexpected end of card " + dev_.path_ + " at offset " + std::to_string(offset_))
              : dev_.transfer(true, offset_ + static_cast<uint64_t>(ev.res), rest.data(),
                              static_cast<int>(rest.size()));
    }
    return dev_.track(std::move(s));
  }

 private:
  // A write made now on this thread, as CardDevice::writev makes one: both ways submit() writes synchronously (no
  // AIO context, io_submit refused) come here. Counted issued by submit() (before any syscall of it), completed here
  // on every way out (an exception of note(), a log line that allocates, or of the write too), the result tracked
  // (the card's failing/working state).
  template <class Note>
  Status write_now(uint64_t offset, const iovec* iov, int count, const Note& note) {
    const ScopeExit completed([this] { dev_.group_sync_.wrote(); });
    note();
    return dev_.track(dev_.transfer(true, offset, iov, count));
  }

  static inline std::atomic<bool> submit_failed_logged_{false}, getevents_failed_logged_{false};
  static inline std::atomic<pid_t> forked_logged_{0};  // the process that logged the forked WARNING
  const CardDevice& dev_;
  pid_t pid_ = 0;       // the process of ctx_
  uint64_t forks_ = 0;  // fork_count() at its io_setup: another value, another process (a forked child)
  aio_context_t ctx_ = 0;
  iocb cb_{};
  std::vector<iovec> iov_;
  uint64_t offset_ = 0, total_ = 0;
  bool in_flight_ = false;
  Status result_;
};

std::unique_ptr<DeviceWriter> CardDevice::make_writer() const {
  static std::atomic<bool> setup_failed_logged{false};
  // ADP_CARD_AIO=0: synchronous writes (an A/B of the overlap in one build: benchmarks/results/*-aio37-*.md).
  const char* aio = std::getenv("ADP_CARD_AIO");
  if (read_only_ || memory_backed_ || (aio && std::string(aio) == "0")) return Device::make_writer();
  auto w = std::make_unique<AioWriter>(*this);  // first: a std::bad_alloc leaves no AIO context behind
  if (const int e = w->setup(); e != 0) {
    if (!setup_failed_logged.exchange(true))
      ADP_WARN(
          "card %s: io_setup failed (%s%s): stores write synchronously, their copy and CRC not overlapped with "
          "the previous write",
          path_.c_str(), errno_text(e).c_str(),
          e == EAGAIN                 ? "; fs.aio-max-nr spent"
          : e == ENOSYS || e == EPERM ? "; not allowed here"
                                      : "");
    return Device::make_writer();
  }
  return w;
}

Status CardDevice::track(Status s) const {
  if (s.ok()) {
    if (const FailingHold::Change c = failing_.success(); c.ended)
      ADP_INFO(
          "card %s: I/O works again (%llu I/O errors in %.1f s; failing until one succeeded %lld ms after the last)",
          path_.c_str(), static_cast<unsigned long long>(c.errors), c.seconds,
          static_cast<long long>(failing_hold_ms().load(std::memory_order_relaxed)));
  } else if (failing_.error().started) {
    ADP_ERROR("card %s: I/O failing: %s", path_.c_str(), s.message().c_str());
  }
  return s;
}

Status CardDevice::readv(uint64_t offset, const iovec* iov, int count) const {
  return track(transfer(false, offset, iov, count));
}

Status CardDevice::writev(uint64_t offset, const iovec* iov, int count) const {
  if (read_only_)
    return Status::InvalidArgument("card " + path_ +
                                   " is open read-only (status, verify without --repair): nothing is written to it");
  group_sync_.issue();  // a failed sync from now on may lose it (before the syscall: util/group_sync.h)
  Status s = track(transfer(true, offset, iov, count));
  group_sync_.wrote();  // a sync from now on covers it
  return s;
}

Status CardDevice::sync(uint64_t since) const {
  return group_sync_.sync(
      [this] {
        if (::fdatasync(fd_) != 0)
          return track(Status::IoError("fdatasync of " + path_ + " failed: " + errno_text(errno)));
        return Status::Ok();
      },
      since);
}

}  // namespace adp
