// SPDX-License-Identifier: Apache-2.0
#include "protocol/client_segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "protocol/frame.h"
#include "util/amount.h"
#include "util/log.h"
#include "util/populate.h"
#include "util/prefault.h"
#include "util/thread_name.h"

namespace adp::proto {
namespace {

// The mapped segments, read by the SIGBUS handler (lock-free: atomics only).
// A slot is taken by a mapping and given back when it is unmapped.
constexpr int kSlots = 4096;
struct Slot {
  std::atomic<uintptr_t> lo{0}, hi{0};
  std::atomic<bool> broken{false};
  std::atomic<bool> used{false};
};
Slot g_slots[kSlots];
struct sigaction g_previous;
std::once_flag g_installed;

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& s : g_slots) {
    uintptr_t lo = s.lo.load(std::memory_order_acquire), hi = s.hi.load(std::memory_order_acquire);
    if (lo == 0 || addr < lo || addr >= hi) continue;
    // The client shrank its file: anonymous memory over the rest of the
    // segment lets the faulting access (and any after it) complete.
    uintptr_t page = addr & ~uintptr_t(4095);
    long r = syscall(SYS_mmap, page, hi - page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (r == -1) break;  // cannot repair: fall through to the previous disposition
    s.broken.store(true, std::memory_order_release);
    return;
  }
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, uctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    return g_previous.sa_handler(sig);
  }
  // Default action: restore it; returning re-runs the access, which faults again and ends the process.
  signal(SIGBUS, SIG_DFL);
}

void install_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

int take_slot(uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < kSlots; i++) {
    bool expected = false;
    if (!g_slots[i].used.compare_exchange_strong(expected, true)) continue;
    g_slots[i].broken.store(false);
    g_slots[i].hi.store(hi, std::memory_order_release);
    g_slots[i].lo.store(lo, std::memory_order_release);
    return i;
  }
  return -1;
}

// The client's name for the file (its /dev/shm path), for the log.
std::string file_name(int fd) {
  char name[PATH_MAX] = "a client segment";
  const std::string fd_link = "/proc/self/fd/" + std::to_string(fd);
  if (ssize_t n = ::readlink(fd_link.c_str(), name, sizeof name - 1); n > 0) name[n] = 0;
  return log_safe(name);
}

// The filesystem type of the mount fd was opened through (/proc/self/fdinfo's mnt_id, looked up in
// /proc/self/mountinfo), read without asking the filesystem; "" where this mount namespace does not list it.
std::string mount_fs_type(int fd) {
  std::ifstream info("/proc/self/fdinfo/" + std::to_string(fd));
  std::string line, mnt;
  while (mnt.empty() && std::getline(info, line))
    if (line.starts_with("mnt_id:")) mnt = line.substr(line.find_first_not_of(" \t", 7));
  if (mnt.empty()) return "";
  std::ifstream mounts("/proc/self/mountinfo");
  while (std::getline(mounts, line)) {
    if (!line.starts_with(mnt + " ")) continue;
    const size_t sep = line.find(" - ");
    if (sep == std::string::npos) return "";
    return line.substr(sep + 3, line.find(' ', sep + 3) - (sep + 3));
  }
  return "";
}

// Whether fd is no file of a filesystem's tree (a pipe, a socket, an anonymous inode: its /proc/self/fd link,
// read without asking any filesystem, is "pipe:[...]" and the like): its fstat asks no server.
bool pseudo_file(int fd) {
  char name[8];
  const std::string fd_link = "/proc/self/fd/" + std::to_string(fd);
  return ::readlink(fd_link.c_str(), name, sizeof name) > 0 && name[0] != '/';
}

// The path fd was opened by (its /proc/self/fd link, which the kernel answers without asking the filesystem), or
// "descriptor N" where it has none.
std::string fd_path(int fd) {
  char name[PATH_MAX];
  const std::string fd_link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(fd_link.c_str(), name, sizeof name);
  return n > 0 ? std::string(name, static_cast<size_t>(n)) : "descriptor " + std::to_string(fd);
}

// Why fd, a segment, is not mapped where its accesses could wait on a FUSE server, or "" (asking no filesystem:
// fstat and fstatfs of a FUSE file ask its server). A file that has seals (the kernel answers F_GET_SEALS for a
// tmpfs or hugetlbfs file itself, and refuses any other) is memory; else its mount's type; a mount this
// namespace does not list (a client in a mount namespace of its own) is refused, but for a pipe or socket (the
// regular-file check refuses those): only fstatfs could tell, and a FUSE server that never answers it held the
// connection's thread for good.
std::string not_mappable(int fd) {
  if (::fcntl(fd, F_GET_SEALS) >= 0) return "";
  const std::string type = mount_fs_type(fd);
  if (type.empty() && !pseudo_file(fd))
    return "segment not mapped: a file of a mount the gateway does not see (another mount namespace's), not a "
           "memory file; register memory files (/dev/shm)";
  return segment_fs_refusal(type, fd_path(fd));
}

// `s` made printable ASCII (log_safe's \xNN escapes: it is the client's, and goes to the log) and, if longer than
// `max` bytes, cut in the middle: its head, "...", its tail, never through an escape.
std::string middle_cut(std::string_view s, size_t max) {
  std::string text = log_safe(s, SIZE_MAX);
  if (text.size() <= max) return text;
  size_t head = (max - 3) / 2, tail = text.size() - (max - 3 - head);
  // An escape is 4 bytes from its backslash (a backslash of the text is escaped too): none is cut part-way.
  if (const size_t b = text.rfind('\\', head - 1); b != std::string::npos && b + 4 > head) head = b;
  if (const size_t b = text.rfind('\\', tail - 1); b != std::string::npos && b + 4 > tail) tail = b + 4;
  return text.substr(0, head) + "..." + text.substr(tail);
}

}  // namespace

std::string segment_fs_refusal(std::string_view type, std::string_view path) {
  const char* what = nullptr;  // the file's kind, then why its accesses could wait
  const char* why = nullptr;
  if (type == "fuse" || type == "fuseblk" || type.starts_with("fuse.")) {
    what = "a FUSE file";
    why = "its server decides when the gateway's accesses complete";
  }
  // A network filesystem's pages come from its server too: an access to the mapping waits on it (a hard NFS mount
  // for good, as a FUSE server that never answers), and its shared mappings are not kept coherent with another
  // host's writes (debt37). Those the kernel names so in mountinfo; a FUSE one (sshfs, glusterfs) is refused above.
  // OrangeFS's kernel client registers "pvfs2" (`mount -t pvfs2`), BeeGFS's "beegfs" (review37a: until then
  // "orangefs" only, a name no mount shows, and BeeGFS missing).
  static constexpr std::string_view kNetwork[] = {"nfs",   "nfs4",     "cifs",   "smb3",   "smbfs",     "9p",
                                                  "ceph",  "afs",      "coda",   "lustre", "glusterfs", "ncpfs",
                                                  "pvfs2", "orangefs", "beegfs", "gpfs"};
  for (std::string_view net : kNetwork)
    if (type == net) {
      what = "a network filesystem's file";
      why = "its server decides when accesses complete and shared mappings are not coherent across hosts";
    }
  // A hypervisor's shared folder: the guest's file is the host's, served by a file server there. virtiofs is FUSE
  // (fs/fuse/virtio_fs.c registers "virtiofs", so mountinfo does not say "fuse.": until debt38b it was mapped), its
  // server the host's virtiofsd: without DAX a fault reads the page through it (FUSE_READ); with DAX the mapping is
  // the host's page cache through the device's window, and a fault outside the window's present ranges waits for a
  // FUSE_SETUPMAPPING, the window's ranges reclaimed by REMOVEMAPPING when it fills. The gateway and its client are
  // one kernel (the segment's fd was passed over a Unix socket), and within one kernel MAP_SHARED mappings of a file
  // share its pages in both modes (the page cache; DAX: the window's pages), so it is the wait on the host's server
  // that refuses it, as for FUSE, in either mode (without DAX the host's and other guests' writes are not coherent
  // with the mapping either). VirtualBox's vboxsf (fs/vboxsf: pages read from and written back to the host's shared
  // folder service) alike; VMware's "vmhgfs" (open-vm-tools' kernel client; its FUSE client "fuse.vmhgfs-fuse" is
  // refused above) and Parallels' "prl_fs" too.
  static constexpr std::string_view kHypervisor[] = {"virtiofs", "vboxsf", "vmhgfs", "prl_fs"};
  for (std::string_view shared : kHypervisor)
    if (type == shared) {
      what = "a hypervisor-shared file";
      why = "the host's file server decides when the gateway's accesses complete";
    }
  if (!what) return "";
  // The reason fits the Error frame whole (kMaxMessageBytes, docs/protocol.md: a wire limit, not raised), and the
  // gateway's log line of it (ClientHandler::refuse) as long (debt38b: it ran to 260 bytes and more, the verdict
  // "not mapped" at its end, past the log line's cut at 200 and, with a long path, past the frame's). The verdict
  // first, then the kind of file and the type; the path, the client's and of any length, gets what is left, cut in
  // the middle. A type is short ("nfs4", "fuse.sshfs"); one longer than kTypeBytes (a FUSE subtype is its
  // mounter's choice) is cut in the middle too.
  constexpr size_t kTypeBytes = 48, kMinPathBytes = 32;
  const std::string shown_type = middle_cut(type, kTypeBytes);
  const std::string head = std::string("segment not mapped: ") + what + " (" + shown_type + " mount: ";
  const std::string tail = std::string("): ") + why + "; register memory files (/dev/shm)";
  const size_t fixed = head.size() + tail.size();
  const size_t room = fixed + kMinPathBytes < kSegmentReasonBytes ? kSegmentReasonBytes - fixed : kMinPathBytes;
  return head + middle_cut(path, room) + tail;
}

namespace {

constexpr int kPageShift = 12;  // populated-ness is tracked per 4 KiB page
// The populated bitmap is made per 1 GiB of segment (4096 words, 32 KiB), on the first page of it populated
// (review33b F2): a segment's stated size, up to 1 TiB of a sparse file that cost its client nothing, cost the
// gateway a zeroed, so resident, bitmap of 32 MiB at its registration; now 8 bytes a GiB (the chunks' table) and
// 32 KiB for each GiB the loads or the prefault touched.
constexpr int kChunkShift = 30;
constexpr uint64_t kChunkWords = (uint64_t{1} << (kChunkShift - kPageShift)) / 64;

// The mappings in use, by file identity: a file registered again (by any
// connection) shares the mapping while its size is unchanged.
std::mutex g_mu;
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<SegmentMapping>> g_mappings;
// The bytes of those mappings (each counted once, however many connections share it): address space, held to a
// gateway's --max-segment-total-gb at each new mapping. Under g_mu.
uint64_t g_mapped_bytes = 0;

}  // namespace

struct SegmentMapping {
  int fd = -1;
  uint8_t* data = nullptr;
  uint64_t size = 0;
  int slot = -1;
  std::pair<dev_t, ino_t> id;
  // One bit per 4 KiB page (1/32768 of what was populated, against 1/512 for the page tables that those pages
  // cost anyway), in chunks of kChunkWords words made on first use (word()); a chunk not made has none populated.
  std::unique_ptr<std::atomic<std::atomic<uint64_t>*>[]> chunks;
  // On a memory filesystem (tmpfs, hugetlbfs, ramfs): a write fault
  // allocates or maps a page there and dirties nothing that is written back.
  bool in_memory = false;
  // Queued for, or gone over by, a SegmentPrefaulter (given back if it let
  // the mapping go part-way, so a later registration queues it again), or
  // left to the loads (not in_memory).
  std::atomic<bool> queued{false};

  // The bits of word w in pages [first, last].
  static uint64_t mask(uint64_t w, uint64_t first, uint64_t last) {
    const uint64_t lo = std::max(first, w * 64), hi = std::min(last, w * 64 + 63);
    const uint64_t n = hi - lo + 1;
    return (n == 64 ? ~uint64_t(0) : ((uint64_t(1) << n) - 1)) << (lo % 64);
  }
  // Word w of the bitmap; null where its chunk is not made (make: made now, zeroed; null without memory for it).
  std::atomic<uint64_t>* word(uint64_t w, bool make) const {
    std::atomic<std::atomic<uint64_t>*>& slot = chunks[w / kChunkWords];
    std::atomic<uint64_t>* chunk = slot.load(std::memory_order_acquire);
    if (!chunk && make) {
      std::atomic<uint64_t>* made = new (std::nothrow) std::atomic<uint64_t>[kChunkWords]();
      if (!made) return nullptr;
      if (slot.compare_exchange_strong(chunk, made, std::memory_order_acq_rel))
        chunk = made;
      else
        delete[] made;  // another thread's came first (chunk holds it)
    }
    return chunk ? chunk + w % kChunkWords : nullptr;
  }
  bool all_populated(uint64_t first, uint64_t last) const {
    for (uint64_t w = first / 64; w <= last / 64; w++) {
      const std::atomic<uint64_t>* bits = word(w, false);
      if (!bits || (bits->load(std::memory_order_relaxed) & mask(w, first, last)) != mask(w, first, last)) return false;
    }
    return true;
  }
  // Its pages stay populated (the mapping is never unmapped in part). False without memory for a chunk: those
  // pages are left unmarked, and a later load populates them again (one system call), as before they were first.
  bool mark_populated(uint64_t first, uint64_t last) {
    bool all = true;
    for (uint64_t w = first / 64; w <= last / 64; w++) {
      if (std::atomic<uint64_t>* bits = word(w, true))
        bits->fetch_or(mask(w, first, last), std::memory_order_relaxed);
      else
        all = false;
    }
    return all;
  }
  bool broken() const { return g_slots[slot].broken.load(std::memory_order_acquire); }

  ~SegmentMapping() {
    if (!data) {  // not mapped (Attach refused it): only its chunks' table, none made
      return;
    }
    {
      std::lock_guard<std::mutex> l(g_mu);
      auto it = g_mappings.find(id);
      if (it != g_mappings.end() && it->second.expired()) g_mappings.erase(it);
      g_mapped_bytes -= size;
    }
    if (chunks)
      for (uint64_t c = 0; c <= (size >> kChunkShift); c++) delete[] chunks[c].load(std::memory_order_relaxed);
    Slot& s = g_slots[slot];
    s.lo.store(0, std::memory_order_release);
    s.hi.store(0, std::memory_order_release);
    // Unmaps the file's pages and any anonymous memory laid over them.
    ::munmap(data, size);
    ::close(fd);
    s.used.store(false, std::memory_order_release);
  }
};

uint64_t ClientSegment::mapped_bytes() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_mapped_bytes;
}

Status ClientSegment::Attach(int fd, uint64_t bytes, uint64_t max_total_bytes, std::unique_ptr<ClientSegment>* out) {
  // A FUSE file's pages come from its server, which may be the client itself (an unprivileged fusermount): a
  // page it never delivers would stall the gateway's access to the mapping without bound, and a load into a
  // segment populates and copies into it inside the card read, under an I/O context (stop() and even SIGKILL
  // wait out a read the server took). Told apart before anything asks that server (fstat may): the client
  // registers /dev/shm files only; the ring serves any other buffer.
  if (const std::string why = not_mappable(fd); !why.empty()) {
    ::close(fd);
    return Status::InvalidArgument(why);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes) {
    ::close(fd);
    return Status::InvalidArgument("segment descriptor is not a regular file of the stated size");
  }
  std::call_once(g_installed, install_handler);
  const auto id = std::make_pair(st.st_dev, st.st_ino);
  // The mapping found for the file, declared before the lock so that it is let go of after g_mu is (review33d): one
  // that cannot be shared (its size changed, it broke) may hold the last reference, another connection having let
  // go of it since the look-up, and ~SegmentMapping takes g_mu (dropped under it, that thread waited on itself).
  // So is a new one (m below): a std::bad_alloc out of the ClientSegment's allocation, once it is mapped and
  // registered, unmaps it on the way out.
  std::shared_ptr<SegmentMapping> found, m;
  std::lock_guard<std::mutex> l(g_mu);
  auto it = g_mappings.find(id);
  if (it != g_mappings.end()) {
    found = it->second.lock();
    if (found && found->size == bytes && !g_slots[found->slot].broken.load()) {
      ::close(fd);  // this connection proved access; the mapping has an fd of its own
      out->reset(new ClientSegment(std::move(found)));
      return Status::Ok();
    }
  }
  // The refusals from here on are about this gateway's state, not the file: each reason starts with
  // kSegmentRetryLater, so that the client registers the file again later (protocol r19, review33b F5) where it sent
  // its buffers through the ring for good.
  auto later = [fd](const std::string& why) {
    ::close(fd);
    return Status::Busy(std::string(kSegmentRetryLater) + why);
  };
  // Address space (review33b F2): each segment is a mapping of its whole stated size (up to 1 TiB), and the
  // gateway's 128 TiB ran out after ~127 of them, and with them every other mapping it makes (rings, store buffers,
  // staging). Held to --max-segment-total-gb, new mappings only (one shared by connections counted once).
  // A file larger than the whole cap is mapped in no state of this gateway: refused for good, as a file that cannot
  // be mapped (review33d: "for now", its client registered it again every 60 s for its life, each time on a new
  // connection).
  if (bytes > max_total_bytes) {
    ::close(fd);
    return Status::InvalidArgument("segment of " + log_amount(bytes) + " is larger than --max-segment-total-gb (" +
                                   log_amount(max_total_bytes) + "): not mapped");
  }
  if (g_mapped_bytes > max_total_bytes - bytes)
    return later("the segments mapped in this gateway take " + log_amount(g_mapped_bytes) + "; this one's " +
                 log_amount(bytes) + " would pass --max-segment-total-gb (" + log_amount(max_total_bytes) + ")");
  // What may throw first, with nothing to undo (a mapping not made frees only its chunks' table): thrown, it failed
  // the connection (note_failure), which the client took for a refusal of the file. The entry in g_mappings too:
  // an empty one (a mapping gone) is harmless.
  try {
    m = std::make_shared<SegmentMapping>();
    // One chunk past the last whole GiB (the bitmap's words reach page (bytes - 1) >> kPageShift).
    m->chunks.reset(new std::atomic<std::atomic<uint64_t>*>[(bytes >> kChunkShift) + 1]());
    g_mappings.try_emplace(id);
  } catch (const std::bad_alloc&) {
    return later("no memory to keep the segment's state (std::bad_alloc)");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    // Out of address space or of mappings (ENOMEM: RLIMIT_AS, vm.max_map_count), or of descriptors: this gateway's
    // state, which may change; any other errno (ENODEV: a file that cannot be mapped, EACCES, EPERM) is the file's.
    if (err == ENOMEM || err == EAGAIN || err == ENFILE || err == EMFILE)
      return later("cannot map the segment: " + errno_text(err));
    ::close(fd);
    return Status::InvalidArgument("cannot map the segment: " + errno_text(err));
  }
  uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  int slot = take_slot(lo, lo + bytes);
  if (slot < 0) {
    ::munmap(p, bytes);
    return later("too many segments mapped in this gateway");
  }
  m->fd = fd;
  m->data = static_cast<uint8_t*>(p);
  m->size = bytes;
  m->slot = slot;
  m->id = id;
  g_mapped_bytes += bytes;  // given back by ~SegmentMapping
  struct statfs fs{};
  m->in_memory =
      ::fstatfs(fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC || fs.f_type == RAMFS_MAGIC);
  g_mappings[id] = m;  // made above: no allocation
  out->reset(new ClientSegment(std::move(m)));
  return Status::Ok();
}

ClientSegment::~ClientSegment() = default;
uint8_t* ClientSegment::data() const { return m_->data; }
uint64_t ClientSegment::size() const { return m_->size; }
bool ClientSegment::broken() const { return m_->broken(); }

bool ClientSegment::prepare(uint64_t offset, uint64_t len) {
  if (len == 0) return false;
  // Pages [first, last] hold the range; bits [first, last] of populated.
  const uint64_t first = offset >> kPageShift, last = (offset + len - 1) >> kPageShift;
  if (m_->all_populated(first, last)) return false;
  uint64_t lo = first << kPageShift, hi = (last + 1) << kPageShift;
  if (hi > m_->size) hi = m_->size;
  // Refused by this kernel (util/populate.h): false, without a system call.
  if (!populate_write(m_->data + lo, hi - lo)) return false;
  m_->mark_populated(first, last);
  return true;
}

void SegmentPrefaulter::add(const ClientSegment& seg) {
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_ || seg.m_->queued.exchange(true)) return;
  if (!seg.m_->in_memory) {  // marked queued: not looked at again
    ADP_DEBUG(
        "gateway: segment %s is not on a memory filesystem (tmpfs, hugetlbfs): not populated in the background "
        "(that would dirty every written page of the file); its loads populate their own pages",
        file_name(seg.m_->fd).c_str());
    return;
  }
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::exception& e) {
      // No thread (std::system_error: a pids limit, memory; std::bad_alloc: its state): its loads populate their own
      // pages, and a later registration tries again. Thrown, the exception ended the gateway (std::terminate on the
      // registering connection's thread).
      seg.m_->queued.store(false);
      ADP_WARN_LIMITED(
          "gateway: segment %s: no thread to populate it in the background (%s); its loads populate "
          "their own pages",
          file_name(seg.m_->fd).c_str(), e.what());
      return;
    }
  }
  queue_.push_back(seg.m_);
  pending_.fetch_add(1, std::memory_order_relaxed);
  cv_.notify_one();
}

void SegmentPrefaulter::stop() {
  // Allocates nothing (session 28: it runs in ~SegmentPrefaulter; the std::deque it swapped the queue into allocated
  // its map, and a std::bad_alloc there ended the gateway, std::terminate).
  std::thread t;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    stop_.store(true, std::memory_order_relaxed);
    t = std::move(thread_);
    pending_.fetch_sub(queue_.size(), std::memory_order_release);
  }
  cv_.notify_all();
  if (t.joinable()) t.join();
  // The thread is gone and add() queues nothing once stopping_ is set: queue_ is this thread's alone (walked without
  // mu_: a mapping whose last owner goes here is unmapped under g_mu, never under mu_).
  for (auto& w : queue_)  // not begun: another prefaulter of this process may take them
    if (auto m = w.lock()) m->queued.store(false);
  queue_.clear();
}

void SegmentPrefaulter::run() {
  set_thread_name("adp-segpopulate");
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::weak_ptr<SegmentMapping> next = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    if (std::shared_ptr<SegmentMapping> m = next.lock()) {  // the last holder unmaps it here
      try {
        populate(m);
      } catch (const std::exception& e) {
        // Session 29: an exception here (std::bad_alloc: the segment's file name, a log line's amount, the walk's
        // window) ended the gateway (std::terminate on this thread). The segment is left to its loads (they populate
        // their own pages) and let go of, so that a later registration queues it again; this thread goes on.
        m->queued.store(false);
        ADP_ERROR(
            "gateway: populating a segment in the background stopped on an exception (%s); its loads populate "
            "their own pages",
            e.what());
      }
    }
    pending_.fetch_sub(1, std::memory_order_release);
    l.lock();
  }
}

void SegmentPrefaulter::populate(const std::shared_ptr<SegmentMapping>& m) {
  if (populate_refused(m->data)) return;  // logged once, at WARNING, by util/populate.h
  const std::string name_text = file_name(m->fd);
  const char* name = name_text.c_str();
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  uint64_t bytes = 0;
  bool failed = false;
  const ExtentWalk w = walk_written_extents(m->fd, m->size, [&](uint64_t p, uint64_t n) {
    // Let go of it: the gateway stops, every connection released it (this
    // is the last reference), or its client shrank the file.
    if (stop_.load(std::memory_order_relaxed) || m.use_count() == 1 || m->broken()) return false;
    if (before_piece_for_test) before_piece_for_test(p);
    const uint64_t first = p >> kPageShift, last = (p + n - 1) >> kPageShift;
    if (m->all_populated(first, last)) return true;  // loads came first
    const auto t0 = Clock::now();
    bool ok;
    do ok = populate_write(m->data + p, n);
    while (!ok && errno == EINTR);
    const int err = errno;
    ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(),
                  std::memory_order_relaxed);
    if (!ok) {
      // EFAULT: the client shrank its file under it (a load into it fails the same way).
      ADP_WARN(
          "gateway: populating segment %s in the background stopped at offset %llu: %s; loads populate "
          "their own pages from there",
          name, static_cast<unsigned long long>(p), errno_text(err).c_str());
      failed = true;
      return false;
    }
    // No memory for its bitmap's chunk: as any other allocation of this thread that fails (run()), the segment is
    // left to its loads.
    if (!m->mark_populated(first, last)) throw std::bad_alloc();
    bytes += n;
    bytes_.fetch_add(n, std::memory_order_relaxed);
    return true;
  });
  if (w.end == ExtentWalk::End::kSeekFailed)
    ADP_WARN(
        "gateway: segment %s: cannot find its written pages past offset %llu (%s); loads populate their own "
        "pages from there",
        name, static_cast<unsigned long long>(w.at), errno_text(w.err).c_str());
  if (w.end != ExtentWalk::End::kDone) {
    if (!failed && w.end == ExtentWalk::End::kStopped) m->queued.store(false);  // let go: a later registration may
    return;
  }
  done_.fetch_add(1, std::memory_order_relaxed);
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  ADP_INFO("gateway: segment %s (%s): %s of written pages populated in the background in %.3f s", name,
           log_amount(m->size).c_str(), log_amount(bytes).c_str(), s);
}

}  // namespace adp::proto
