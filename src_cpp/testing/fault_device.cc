// SPDX-License-Identifier: Apache-2.0
#include "testing/fault_device.h"

#include <algorithm>
#include <cstring>
#include <random>

namespace adp::testing {
namespace {

uint64_t total_bytes(const iovec* iov, int count) {
  uint64_t n = 0;
  for (int i = 0; i < count; i++) n += iov[i].iov_len;
  return n;
}

bool aligned(uint64_t offset, const iovec* iov, int count) {
  if (offset % 4096) return false;
  for (int i = 0; i < count; i++)
    if (iov[i].iov_len % 4096 || reinterpret_cast<uintptr_t>(iov[i].iov_base) % 4096) return false;
  return true;
}

// Copies the first `limit` bytes gathered from iov to dst.
void copy_iov(uint8_t* dst, const iovec* iov, int count, uint64_t limit) {
  for (int i = 0; i < count && limit; i++) {
    uint64_t k = std::min<uint64_t>(iov[i].iov_len, limit);
    std::memcpy(dst, iov[i].iov_base, k);
    dst += k;
    limit -= k;
  }
}

}  // namespace

FaultDevice::FaultDevice(std::shared_ptr<FaultImage> image, std::string name)
    : image_(std::move(image)), name_(std::move(name)) {}

bool FaultDevice::overlaps(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, uint64_t off, uint64_t n) const {
  for (auto [b, e] : ranges)
    if (off < e && b < off + n) return true;
  return false;
}

Status FaultDevice::readv(uint64_t offset, const iovec* iov, int count) const {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t n = total_bytes(iov, count);
  if (!aligned(offset, iov, count)) return Status::InvalidArgument("unaligned read (O_DIRECT would refuse it)");
  if (offset + n > image_->data.size()) return Status::IoError("read past the end of " + name_);
  if (dead_ || overlaps(bad_reads_, offset, n)) {
    healthy_ = false;
    return Status::IoError(std::string("read of ") + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                           " of " + name_ + " failed: " + (dead_ ? "power cut" : "injected"));
  }
  uint64_t pos = offset;
  for (int i = 0; i < count; i++) {
    std::memcpy(iov[i].iov_base, image_->data.data() + pos, iov[i].iov_len);
    pos += iov[i].iov_len;
  }
  healthy_ = true;
  return Status::Ok();
}

void FaultDevice::apply_locked(uint64_t offset, const iovec* iov, int count, uint64_t limit) const {
  uint64_t n = std::min(total_bytes(iov, count), limit);
  if (n == 0) return;
  Undo u{offset, writes_ - 1, applied_++,
         std::vector<uint8_t>(image_->data.begin() + offset, image_->data.begin() + static_cast<ptrdiff_t>(offset + n)),
         std::vector<uint8_t>(n)};
  copy_iov(u.data.data(), iov, count, n);
  std::memcpy(image_->data.data() + offset, u.data.data(), n);
  unsynced_.push_back(std::move(u));
}

void FaultDevice::drop_unsynced_locked() const {
  for (auto it = unsynced_.rbegin(); it != unsynced_.rend(); ++it)
    std::memcpy(image_->data.data() + it->offset, it->old.data(), it->old.size());
  std::mt19937_64 pick(keep_seed_);
  cut_writes_.clear();
  for (const Undo& u : unsynced_) {
    if (u.state == 1) {  // synced, behind a lost write: redone in order (not an unsynced write the cut met)
      std::memcpy(image_->data.data() + u.offset, u.data.data(), u.data.size());
      continue;
    }
    const bool keep = u.state == 0 && (keep_all_ || (keep_some_ && pick() % 2));  // a lost one never comes back
    if (keep) std::memcpy(image_->data.data() + u.offset, u.data.data(), u.data.size());
    cut_writes_.push_back({u.index, u.offset, u.data.size(), keep});
  }
  unsynced_.clear();
}

Status FaultDevice::writev(uint64_t offset, const iovec* iov, int count) const {
  group_sync_.issue();  // as CardDevice: counted before the write, so a failed sync's lost_ includes it
  Status s = write_once(offset, iov, count);
  group_sync_.wrote();  // a sync from now on covers it
  return s;
}

Status FaultDevice::write_once(uint64_t offset, const iovec* iov, int count) const {
  std::unique_lock<std::mutex> l(mu_);
  uint64_t n = total_bytes(iov, count);
  if (!aligned(offset, iov, count)) return Status::InvalidArgument("unaligned write (O_DIRECT would refuse it)");
  if (offset + n > image_->data.size()) return Status::IoError("write past the end of " + name_);
  uint64_t index = writes_++;
  if (observer_) observer_(index, offset, n);
  auto failed = [&](const char* why) {
    healthy_ = false;
    return Status::IoError(std::string("write of ") + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                           " of " + name_ + " failed: " + why);
  };
  if (index == hold_write_n_) {
    held_ = true;
    held_cv_.notify_all();
    held_cv_.wait(l, [this] { return dead_ || released_; });
    held_ = false;
    if (!dead_ && release_fails_) return failed("injected");
  }
  if (dead_) return failed("power cut");
  if (index == cut_write_n_) {
    // The earlier unsynced writes are undone (or some kept); the torn part
    // of this one reached the media: it survives the cut.
    drop_unsynced_locked();
    copy_iov(image_->data.data() + offset, iov, count, std::min(cut_tear_, n));
    dead_ = true;
    return failed("power cut");
  }
  if (index == fail_write_n_) {
    apply_locked(offset, iov, count, fail_write_tear_);
    return failed("injected");
  }
  if (overlaps(bad_writes_, offset, n)) return failed("injected");
  apply_locked(offset, iov, count, UINT64_MAX);
  healthy_ = true;
  return Status::Ok();
}

Status FaultDevice::sync(uint64_t since) const {
  return group_sync_.sync(
      [this] {
        // The writes applied when the flush begins are those it makes durable if it succeeds; one applied while it
        // runs (flushing(), or waiting for mu_) is durable only by a later sync, as with fdatasync, which need not
        // write back a page dirtied after it began (review32b F5). Until session 33 a successful sync made durable
        // every write applied when it took the lock.
        uint64_t begun;
        {
          std::lock_guard<std::mutex> l(mu_);
          begun = applied_;
        }
        flushing();
        std::lock_guard<std::mutex> l(mu_);
        if (dead_) {
          healthy_ = false;
          return Status::IoError("sync of " + name_ + " failed: power cut");
        }
        if (sync_calls_++ == fail_sync_n_) {
          // The device lost its cache: every write it took and no sync made durable, those completed before
          // this flush began (counted or not yet) and those done while it ran (util/group_sync.h).
          if (lose_failed_)
            for (Undo& u : unsynced_)
              if (u.state == 0) u.state = 2;
          return Status::IoError("sync of " + name_ + " failed: injected");
        }
        syncs_++;
        bool lost = false;
        for (const Undo& u : unsynced_) lost |= u.state == 2;
        // unsynced_ is in the order applied: those applied before the flush began are a prefix of it.
        const auto durable =
            std::find_if(unsynced_.begin(), unsynced_.end(), [&](const Undo& u) { return u.seq >= begun; });
        if (!lost)
          unsynced_.erase(unsynced_.begin(), durable);
        else  // kept, to be undone and redone in order at a cut around the lost ones
          for (auto it = unsynced_.begin(); it != durable; ++it)
            if (it->state == 0) it->state = 1;
        return Status::Ok();
      },
      since);
}

bool FaultDevice::healthy() const {
  std::lock_guard<std::mutex> l(mu_);
  return healthy_;
}

void FaultDevice::lose_failed_sync_writes() {
  std::lock_guard<std::mutex> l(mu_);
  lose_failed_ = true;
}

void FaultDevice::fail_sync(uint64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  fail_sync_n_ = n;
}

void FaultDevice::fail_write(uint64_t n, uint64_t tear_bytes) {
  std::lock_guard<std::mutex> l(mu_);
  fail_write_n_ = n;
  fail_write_tear_ = tear_bytes;
}

void FaultDevice::fail_reads(uint64_t begin, uint64_t end) {
  std::lock_guard<std::mutex> l(mu_);
  bad_reads_.push_back({begin, end});
}

void FaultDevice::fail_writes(uint64_t begin, uint64_t end) {
  std::lock_guard<std::mutex> l(mu_);
  bad_writes_.push_back({begin, end});
}

void FaultDevice::cut_power_at_write(uint64_t n, uint64_t tear_bytes) {
  std::lock_guard<std::mutex> l(mu_);
  cut_write_n_ = n;
  cut_tear_ = tear_bytes;
}

void FaultDevice::power_cut() {
  std::lock_guard<std::mutex> l(mu_);
  if (!dead_) drop_unsynced_locked();
  dead_ = true;
  held_cv_.notify_all();
}

void FaultDevice::keep_unsynced_at_cut(uint64_t seed) {
  std::lock_guard<std::mutex> l(mu_);
  keep_some_ = true;
  keep_seed_ = seed;
}

void FaultDevice::keep_all_unsynced_at_cut() {
  std::lock_guard<std::mutex> l(mu_);
  keep_all_ = true;
}

void FaultDevice::observe_writes(std::function<void(uint64_t, uint64_t, uint64_t)> f) {
  std::lock_guard<std::mutex> l(mu_);
  observer_ = std::move(f);
}

uint64_t FaultDevice::kept_at_cut() const {
  std::lock_guard<std::mutex> l(mu_);
  return std::count_if(cut_writes_.begin(), cut_writes_.end(), [](const CutWrite& w) { return w.kept; });
}

std::vector<FaultDevice::CutWrite> FaultDevice::unsynced_at_cut() const {
  std::lock_guard<std::mutex> l(mu_);
  return cut_writes_;
}

uint64_t FaultDevice::dropped_at_cut() const {
  std::lock_guard<std::mutex> l(mu_);
  return std::count_if(cut_writes_.begin(), cut_writes_.end(), [](const CutWrite& w) { return !w.kept; });
}

void FaultDevice::hold_write(uint64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  hold_write_n_ = n;
}

void FaultDevice::release_held_write(bool fail) {
  std::lock_guard<std::mutex> l(mu_);
  released_ = true;
  release_fails_ = fail;
  held_cv_.notify_all();
}

bool FaultDevice::write_held() const {
  std::lock_guard<std::mutex> l(mu_);
  return held_;
}

uint64_t FaultDevice::writes() const {
  std::lock_guard<std::mutex> l(mu_);
  return writes_;
}

uint64_t FaultDevice::syncs() const {
  std::lock_guard<std::mutex> l(mu_);
  return syncs_;
}

uint64_t FaultDevice::syncs_run() const {
  std::lock_guard<std::mutex> l(mu_);
  return sync_calls_;
}

bool FaultDevice::dead() const {
  std::lock_guard<std::mutex> l(mu_);
  return dead_;
}

}  // namespace adp::testing
