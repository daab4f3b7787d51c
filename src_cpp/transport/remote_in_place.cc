// SPDX-License-Identifier: Apache-2.0
// Loads into and stores from the caller's buffers in place, with no ring:
// in shared memory files the gateway maps (protocol r3) or, where granted,
// this process's memory (r5): RemoteSession::run_into_segments and
// try_in_place, the load lease's revoke, and RemoteBackend's cache of this
// process's mappings (find_segment, forget_segments; a SegmentFile's close)
// and its hint for buffers that take the ring. Not here: the ring's path
// (remote_session.cc).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "transport/remote_session.h"
#include "util/log.h"

namespace adp {
namespace {

// find_segment's cache of mappings asked about, before those of no file are dropped (a process that maps and
// unmaps buffers, glibc's large mallocs, would otherwise grow it without end).
constexpr size_t kMaxCachedRanges = 1024;

// Proves that p and file offset `offset` are the same memory (a cached
// mapping may have been replaced): a nonce written through p must read back
// through the file. p's own 8 bytes are put back. Caller holds the batch's
// guard (p is the caller's buffer).
bool aliases(uint8_t* p, const SegmentFile& f, uint64_t offset) {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  uint64_t nonce = counter.fetch_add(0x9E3779B97F4A7C15ull) | 1, saved, seen = 0;
  std::memcpy(&saved, p, 8);
  std::memcpy(p, &nonce, 8);
  bool same = ::pread(f.fd, &seen, 8, static_cast<off_t>(offset)) == 8 && seen == nonce;
  std::memcpy(p, &saved, 8);
  return same;
}

// The regular file at `path`, opened read-write, if it is the one of the
// mapping (dev, ino) and not empty; null otherwise (a name taken by another
// file since, an unlinked file's " (deleted)").
std::shared_ptr<SegmentFile> open_segment_file(const char* path, dev_t dev, ino_t ino) {
  int fd = ::open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == dev && st.st_ino == ino &&
      st.st_size > 0) {
    auto file = std::make_shared<SegmentFile>();
    file->fd = fd;
    file->bytes = static_cast<uint64_t>(st.st_size);
    file->dev = st.st_dev;
    file->ino = st.st_ino;
    return file;
  }
  if (fd >= 0) ::close(fd);
  return nullptr;
}

}  // namespace

SegmentFile::~SegmentFile() {
  if (fd >= 0) ::close(fd);
}
bool RemoteSession::run_into_segments(proto::Op op, const std::string_view* keys, const size_t* sizes,
                                      uint8_t* const* bufs, size_t n, Deadline deadline, const GuardedReadFn& guarded,
                                      const std::function<void(size_t, const Status&)>& finish) {
  // A connection that died while idle (the gateway restarted) gets one more
  // try on a new one, as in run(): only when a frame of it (a registration,
  // the request) never reached the gateway, so nothing was written for it.
  bool retry = false;
  if (try_in_place(op, keys, sizes, bufs, n, deadline, guarded, finish, &retry)) return true;
  return retry && try_in_place(op, keys, sizes, bufs, n, deadline, guarded, finish, nullptr);
}

bool RemoteSession::try_in_place(proto::Op op, const std::string_view* keys, const size_t* sizes, uint8_t* const* bufs,
                                 size_t n, Deadline deadline, const GuardedReadFn& guarded,
                                 const std::function<void(size_t, const Status&)>& finish, bool* retry) {
  const bool put = op == proto::Op::kPut;
  if (!connected(deadline).ok() || n > client_->limits().max_batch_keys) return false;
  // The connection lost after `why`; one more try if lose() says so.
  auto lost = [&](const Status& why) {  // a registration: made anew on the new connection
    if (lose(why, retry != nullptr, true)) *retry = true;
    return false;
  };
  // ptracer_follow: refused while this process named another gateway that has exited since.
  if (Status s = client_->retry_process(deadline); !s.ok()) return lost(s);
  // Per buffer: in a shared memory file the gateway maps (r3), else, where
  // granted, this process's memory (r5); a batch with any other buffer: the ring.
  // A store's buffer may be read by others meanwhile: only the kernel's
  // read-only answer proves its mapping (no nonce written into it).
  const bool in_files = (put ? client_->segment_stores() : client_->segments()) && (!put || maps_.supported());
  const bool in_process = put ? client_->process_stores() : client_->process_loads();
  if (!in_files && !in_process) return false;
  // r6: a store of an object larger than the gateway's store buffer (which
  // it would refuse) goes through the ring, with the rest of its batch.
  const uint64_t process_limit = put ? client_->process_store_limit() : UINT64_MAX;
  std::vector<SegmentSpan> spans(n);
  maps_.batch();
  for (size_t i = 0; i < n; i++) {
    if (!check_key(keys[i]).ok() || sizes[i] == 0) return false;
    if (in_files) spans[i] = backend_->find_segment(bufs[i], sizes[i], maps_);
    if (spans[i].file && spans[i].file->refused) spans[i] = {};
    if (spans[i].file) continue;
    if (in_process && sizes[i] <= process_limit) continue;
    if (in_process) {
      backend_->process_stores_over_limit_.fetch_add(n, std::memory_order_relaxed);
    } else if (in_files) {
      backend_->hint_ring();
    }
    return false;
  }
  proto::BatchRequest req;
  req.op = op;
  req.items.resize(n);
  size_t process_items = 0;
  for (size_t i = 0; i < n; i++) {
    const std::shared_ptr<SegmentFile>& f = spans[i].file;
    if (!f) {  // r5: the gateway writes at the buffer's address in this process
      req.items[i] = {keys[i], sizes[i], reinterpret_cast<uintptr_t>(bufs[i]), proto::kProcessSegment};
      process_items++;
      continue;
    }
    auto it = segment_ids_.find(f);
    if (it == segment_ids_.end()) {
      // Refused for now a moment ago (below): the ring until its back-off ends, this batch's buffers too.
      const int64_t now_ns = Clock::now().time_since_epoch() / std::chrono::nanoseconds(1);
      if (now_ns < f->retry_at_ns.load(std::memory_order_relaxed)) return false;
      uint32_t id = 0;
      Status s = client_->register_segment(f->fd, f->bytes, deadline, &id);
      if (s.code() == Status::Code::kUnavailable && s.message().find(proto::kSegmentRetryLater) != std::string::npos) {
        // r19: refused for the gateway's state (its segments' address space used up, mmap's ENOMEM, no memory), not
        // the file's, and the connection closed: this batch and the file's buffers take the ring (a new connection)
        // until the back-off ends, then a batch registers it again (review33b F5: until r18 any refusal sent them
        // through the ring for the process's life, half speed on a memory-speed card, long after the cause passed).
        const int64_t prev = f->backoff_ms.load(std::memory_order_relaxed);
        const int64_t next = std::clamp<int64_t>(prev * 2, kSegmentFirstBackoff.count(), kSegmentMaxBackoff.count());
        f->backoff_ms.store(next, std::memory_order_relaxed);
        f->retry_at_ns.store(now_ns + next * 1'000'000, std::memory_order_relaxed);
        if (!f->deferred.exchange(true))
          ADP_INFO(
              "%s: %s; buffers in that shared memory file (%llu bytes) go through the ring for now, the file "
              "registered again in %lld s (then at most every %lld s while refused)",
              backend_->describe().c_str(), log_printable(s.message(), kMaxRefusalBytes).c_str(),
              static_cast<unsigned long long>(f->bytes), static_cast<long long>(next / 1000),
              static_cast<long long>(kSegmentMaxBackoff.count() / 1000));
        backend_->drop(&client_);
        return false;
      }
      if (s.code() == Status::Code::kUnavailable) {
        // The gateway refused the file (its Error frame: it cannot map it as stated) and closed the connection.
        // No outage: the file's buffers use the ring from now on, this batch's too, on a new connection. The line
        // carries the frame's whole reason, as it has it (log_safe's 200 bytes cut a segment's refusal: debt39).
        if (!f->refused.exchange(true))
          ADP_INFO("%s: %s; buffers in that shared memory file (%llu bytes) go through the ring from now on",
                   backend_->describe().c_str(), log_printable(s.message(), kMaxRefusalBytes).c_str(),
                   static_cast<unsigned long long>(f->bytes));
        backend_->drop(&client_);
        return false;
      }
      if (!s.ok()) return lost(s);
      if (id == 0) return false;  // this connection's ids are used up
      if (f->backoff_ms.exchange(0, std::memory_order_relaxed) != 0 && f->deferred.exchange(false))
        ADP_INFO(
            "%s: the gateway mapped the shared memory file (%llu bytes) it had refused for now: its buffers go in "
            "place again",
            backend_->describe().c_str(), static_cast<unsigned long long>(f->bytes));
      it = segment_ids_.emplace(f, id).first;
    }
    req.items[i] = {keys[i], sizes[i], spans[i].offset, it->second};
  }
  Status s;
  bool stale = false;
  const bool wanted = guarded([&] {
    // The buffers are still the files' memory (a cached mapping may have been replaced).
    for (size_t i = 0; i < n && !stale; i++) {
      if (!spans[i].file) continue;  // process memory: the buffer is the caller's while the guard is held
      const SegmentFile& f = *spans[i].file;
      MapProof proof = maps_.check(bufs[i], sizes[i], f, spans[i].offset);
      if (proof == MapProof::kUnsupported) {
        const size_t last = (sizes[i] - 1) & ~size_t(7);
        proof = aliases(bufs[i], f, spans[i].offset) && aliases(bufs[i] + last, f, spans[i].offset + last)
                    ? MapProof::kSame
                    : MapProof::kDiffers;
      }
      stale = proof != MapProof::kSame;
    }
    if (stale) return;
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      s = Status::TimedOut("deadline passed before the request was sent");
      return;
    }
    req.timeout_ms = static_cast<uint32_t>(std::min<long long>(left, UINT32_MAX));
    const uint64_t rid = client_->next_request_id();
    __atomic_store_n(client_->lease(), proto::lease_word(rid, proto::kLeaseOpen), __ATOMIC_RELEASE);
    // Revoked on every way out, an exception's included (session 26: the worker then fails the batch, and the
    // gateway must write nothing more into its buffers).
    struct Revoke {
      RemoteSession* session;
      uint64_t rid;
      ~Revoke() { session->revoke_lease(rid); }
    } revoke{this, rid};
    s = send_request(req, {}, deadline);
    if (s.ok()) s = read_reply(req, deadline, &reply_);
  });
  if (stale) {
    backend_->forget_segments();
    return false;
  }
  if (!wanted) s = Status::TimedOut("deadline passed");
  if (s.ok() && !put)
    for (size_t i = 0; i < n && s.ok(); i++)
      if (reply_.results[i].status.ok() && reply_.results[i].size != sizes[i])
        s = Status::InvalidArgument("gateway reply disagrees with the request");
  if (s.ok() && process_items) {
    // EPERM on a process item (this process turned non-dumpable, changed
    // its credentials or its Yama ptracer): the gateway may no longer touch
    // this process. The grant is withdrawn for this connection and the whole
    // batch goes through the ring instead of failing (a load rewrites the
    // same bytes; a store overwrites its own object).
    for (size_t i = 0; i < n; i++) {
      const Status& st = reply_.results[i].status;
      if (spans[i].file || st.code() != Status::Code::kUnavailable) continue;
      client_->withdraw_process("the gateway lost access to this process's memory: " + st.message());
      if (!backend_->process_withdrawn_logged_.exchange(true))
        ADP_INFO("%s: %s; this connection goes through the ring from now on. Logged once.",
                 backend_->describe().c_str(), log_safe(client_->process_refusal()).c_str());
      return false;
    }
  }
  // A request whose send found the connection closed never reached the gateway (nothing can have been
  // written for it): tried again at once on a new connection, quietly (audit 12; lose()). So is a store found
  // closed by its reply's read (the gateway only reads its buffers); a load may have written into them.
  if (!s.ok() && wanted && lose(s, retry != nullptr, put)) {
    *retry = true;
    return false;
  }
  for (size_t i = 0; i < n; i++) {
    const Status& st = s.ok() ? reply_.results[i].status : s;
    if (s.ok()) backend_->note_item(st);
    if (process_items && !spans[i].file && st.ok())
      (put ? backend_->process_stores_ : backend_->process_loads_).fetch_add(1, std::memory_order_relaxed);
    finish(i, st);
  }
  return true;
}

void RemoteSession::revoke_lease(uint64_t rid) {
  uint64_t* word = client_->lease();
  for (;;) {
    uint64_t expected = proto::lease_word(rid, proto::kLeaseOpen);
    if (__atomic_compare_exchange_n(word, &expected, proto::lease_word(rid, proto::kLeaseRevoked), false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return;
    if (expected != proto::lease_word(rid, proto::kLeaseWriting)) return;
    // The gateway is writing one object into the caller's buffer (a
    // memcpy's time on a memory-speed card, staged otherwise): wait it out.
    // Gone (review33b F4: told by a pidfd, so also where its pid is not visible here): no byte can come.
    if (client_->peer_gone()) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void RemoteBackend::hint_ring() {
  if (ring_hinted_.exchange(true, std::memory_order_relaxed)) return;
  ADP_INFO(
      "%s: LMCache's buffers are not in a shared memory file, so their bytes go through the ring: one more copy "
      "of every byte each way, which on a memory-speed card halves loads. Start "
      "`lmcache server` with --shm-name to put its L1 pool in /dev/shm: the gateway then loads into and stores "
      "from it in place (docs/protocol.md, \"Segments\"). Logged once.",
      describe().c_str());
}

std::map<uintptr_t, RemoteBackend::MappedRange>::iterator RemoteBackend::cached_range(uintptr_t lo) {
  auto it = ranges_.upper_bound(lo);
  if (it == ranges_.begin()) return ranges_.end();
  --it;
  return lo < it->second.hi ? it : ranges_.end();
}

SegmentSpan RemoteBackend::span_in(std::map<uintptr_t, MappedRange>::iterator it, uintptr_t lo, size_t len) const {
  if (it == ranges_.end() || !it->second.file || len > it->second.hi - lo) return {};
  uint64_t at = it->second.file_offset + (lo - it->first);
  if (at + len > it->second.file->bytes) return {};
  return {it->second.file, at};
}

std::shared_ptr<SegmentFile> RemoteBackend::open_file(dev_t dev, ino_t ino) const {
  for (const auto& [start, m] : ranges_)
    if (m.file && m.file->dev == dev && m.file->ino == ino) return m.file;
  return nullptr;
}

// Session 32 (benchmarks/results/2026-12-06-1600-maps-scan32.md): the read
// of the whole of /proc/self/maps in a process like LMCache's MP server
// (torch and lmcache imported: ~700 lines) took 2-14 ms on this VM under
// seg_mu_, which every worker's batch takes; with LMCache's L1 anonymous
// (no --shm-name) one batch a second paid it, its other workers waiting on
// the lock. The kernel's answer for the one address is a single ioctl of a
// few microseconds, made outside the lock; so an address cached as no
// shared memory file is asked again once per batch (not once a second): a
// pool remapped into /dev/shm at the same address goes in place from the
// next batch, and the steady batch pays one ioctl per worker and mapping.
SegmentSpan RemoteBackend::find_segment(const uint8_t* p, size_t len, MapQuery& maps) {
  if (!maps.supported()) return find_segment_by_scan(p, len);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  bool unseen = false;  // no cached mapping holds p: a mapping new since the last look-ups
  {
    std::lock_guard<std::mutex> l(seg_mu_);
    auto it = cached_range(lo);
    if (it != ranges_.end() && (it->second.file || maps.asked(lo))) return span_in(it, lo, len);
    unseen = it == ranges_.end();
  }
  ProcmapQuery q;
  if (!maps.find(p, &q)) return {};  // no mapping holds p (the caller's buffer: not seen)
  maps.note_asked(q.vma_start, q.vma_end);
  const dev_t dev = makedev(q.dev_major, q.dev_minor);
  const ino_t ino = static_cast<ino_t>(q.inode);
  // Shared, writable mappings of a regular file in /dev/shm, not deleted (it
  // is opened by name; the kernel's name of an unlinked file ends in
  // " (deleted)", which no open finds as that file). A file already open
  // (by device and inode) is kept, so its ids on live connections stay valid:
  // its name is not asked.
  const uint64_t rws = kVmaReadable | kVmaWritable | kVmaShared;
  std::shared_ptr<SegmentFile> file;
  if ((q.vma_flags & rws) == rws && q.inode != 0) {
    {
      std::lock_guard<std::mutex> l(seg_mu_);
      file = open_file(dev, ino);
    }
    char name[PATH_MAX];
    ProcmapQuery named;
    if (!file && maps.find(p, &named, name, sizeof name) && named.vma_start == q.vma_start &&
        std::string_view(name).starts_with("/dev/shm/")) {
      file = open_segment_file(name, dev, ino);
    }
  }
  std::lock_guard<std::mutex> l(seg_mu_);
  // Another session may have opened the same file meanwhile: one SegmentFile a file.
  if (file)
    if (auto known = open_file(dev, ino)) file = std::move(known);
  auto it = ranges_.find(static_cast<uintptr_t>(q.vma_start));
  if (it != ranges_.end() && it->second.hi == q.vma_end && it->second.file_offset == q.vma_offset &&
      it->second.file == file)
    return span_in(it, lo, len);  // as cached (the steady batch's re-check: nothing allocated)
  // The mappings cached over [vma_start, vma_end) are gone (replaced by this one).
  auto first = ranges_.lower_bound(static_cast<uintptr_t>(q.vma_start));
  if (first != ranges_.begin() && std::prev(first)->second.hi > q.vma_start) --first;
  ranges_.erase(first, ranges_.lower_bound(static_cast<uintptr_t>(q.vma_end)));
  // Mappings cached once and unmapped since stay until one over them is asked
  // about: at most kMaxCachedRanges, then those of no file go (a file's are
  // kept for its SegmentFile).
  if (ranges_.size() >= kMaxCachedRanges) std::erase_if(ranges_, [](const auto& e) { return !e.second.file; });
  // A file only this cache holds (found, never registered on a connection, or
  // its registration gone with the connection) whose mapping is gone is
  // closed (review32b F2: its tmpfs pages would stay allocated while the
  // unlinked file is open). Asked of the kernel at an address no cached
  // mapping held (a new mapping: rare on the steady path, where LMCache's
  // buffers stay put), one ioctl per such file; a file also held elsewhere
  // (a registration, a batch's span) is kept.
  if (unseen)
    std::erase_if(ranges_, [&](const auto& e) {
      const MappedRange& m = e.second;
      if (!m.file || m.file.use_count() != 1) return false;
      ProcmapQuery now;
      return !maps.find(reinterpret_cast<const uint8_t*>(e.first), &now) || now.vma_start != e.first ||
             now.inode != m.file->ino || makedev(now.dev_major, now.dev_minor) != m.file->dev ||
             now.vma_offset != m.file_offset;
    });
  it =
      ranges_.emplace(static_cast<uintptr_t>(q.vma_start), MappedRange{q.vma_end, q.vma_offset, std::move(file)}).first;
  return span_in(it, lo, len);
}

SegmentSpan RemoteBackend::find_segment_by_scan(const uint8_t* p, size_t len) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> l(seg_mu_);
  auto it = cached_range(lo);
  auto now = std::chrono::steady_clock::now();
  // An address no cached mapping holds is newer than the last read: read
  // again. One known to be anonymous: again at most once a second (it may
  // have been replaced by a file mapping; till then it uses the ring).
  if (it == ranges_.end() || (!it->second.file && now - maps_read_at_ >= std::chrono::seconds(1))) {
    maps_read_at_ = now;
    // Files already open are kept (by device and inode), so their ids on
    // live connections stay valid.
    std::map<std::pair<dev_t, ino_t>, std::shared_ptr<SegmentFile>> open;
    for (auto& [start, m] : ranges_)
      if (m.file) {
        struct stat st;
        if (::fstat(m.file->fd, &st) == 0) open[{st.st_dev, st.st_ino}] = m.file;
      }
    ranges_.clear();
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      unsigned long long start, end, off, ino;
      unsigned maj, mnr;
      char perms[8];
      int path_at = 0;
      if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &off, &maj, &mnr, &ino,
                      &path_at) < 7)
        continue;
      MappedRange m{static_cast<uintptr_t>(end), off, nullptr};
      std::string path = path_at > 0 ? line.substr(path_at) : "";
      // Shared, writable mappings of a file in /dev/shm (not deleted: it is opened by name).
      if (std::string_view(perms).substr(0, 2) == "rw" && perms[3] == 's' && path.rfind("/dev/shm/", 0) == 0) {
        auto key = std::make_pair(static_cast<dev_t>(makedev(maj, mnr)), static_cast<ino_t>(ino));
        auto f = open.find(key);
        if (f != open.end()) {
          m.file = f->second;
        } else if ((m.file = open_segment_file(path.c_str(), key.first, key.second))) {
          open[key] = m.file;
        }
      }
      ranges_[static_cast<uintptr_t>(start)] = std::move(m);
    }
    it = cached_range(lo);
  }
  return span_in(it, lo, len);
}

void RemoteBackend::forget_segments() {
  std::lock_guard<std::mutex> l(seg_mu_);
  ranges_.clear();
  maps_read_at_ = {};
}

}  // namespace adp
