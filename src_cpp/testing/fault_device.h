// SPDX-License-Identifier: Apache-2.0
// FaultDevice: an in-memory card for tests that fails what it is told to
// (after LevelDB's fault-injection test env and CacheLib Navy's MockDevice;
// the code is our own). It can
//   - fail the n-th write, or every read/write touching a byte range;
//   - tear a write: only its first bytes reach the image;
//   - fail the n-th sync (the writes before it stay unsynced: a later sync
//     may still make them durable, as after a failed fdatasync); syncs are
//     grouped as CardDevice's (util/group_sync.h): callers share a sync that
//     began after their completed writes, and a failed one fails them all;
//     a sync that succeeds makes durable the writes applied before it began,
//     not those applied while it ran (a later sync does), as fdatasync
//     guarantees no more (session 33, review32b F5);
//   - cut power: at a chosen write (which may be torn) the device dies,
//     every later I/O fails, and every write not yet synced is undone; or,
//     with keep_unsynced_at_cut(seed), a seeded arbitrary subset of them
//     survives (as a disk's cache reorders: LevelDB's fault-injection env
//     keeps or drops unsynced data the same way); or, with
//     keep_all_unsynced_at_cut(), every write before the cut survives (a
//     process crash: the writes are ordered as the process issued them).
// The image lives in a FaultImage shared with the test, so a store can be
// closed and the card opened again (a reboot) on what survived.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store/device.h"
#include "util/group_sync.h"

namespace adp::testing {

struct FaultImage {
  explicit FaultImage(uint64_t bytes) : data(bytes, 0) {}
  std::vector<uint8_t> data;
};

class FaultDevice : public Device {
 public:
  explicit FaultDevice(std::shared_ptr<FaultImage> image, std::string name = "fault-device");

  const std::string& path() const override { return name_; }
  uint64_t size() const override { return image_->data.size(); }
  Status readv(uint64_t offset, const iovec* iov, int count) const override;
  Status writev(uint64_t offset, const iovec* iov, int count) const override;
  Status sync(uint64_t since) const override;
  uint64_t write_mark() const override { return group_sync_.mark(); }
  bool lost_after(uint64_t since) const override { return group_sync_.lost_after(since); }
  bool healthy() const override;

  // --- faults (set before or between I/O; thread-safe)
  // The n-th write (0-based, counted from this device's creation) fails
  // without touching the image; with tear_bytes > 0 its first tear_bytes
  // bytes are written first (a torn write).
  void fail_write(uint64_t n, uint64_t tear_bytes = 0);
  // The n-th sync run (0-based, counted from this device's creation; callers
  // grouped into one run count once) fails, for every caller it covered; the
  // writes it should have made durable stay unsynced (a later sync makes
  // them durable, a power cut before it undoes them).
  void fail_sync(uint64_t n);
  // From now on a failed sync loses, for good, every write the device took before it failed that no successful
  // sync had made durable: those completed when it began, and those applied while it ran (before its flush()
  // hook and during it) or applied before it began but not yet counted as completed: they sat in the cache the
  // failed flush lost (a device whose cache flush failed, a device reset; a kernel that dropped the dirty pages).
  // They never reach the media, whatever sync follows. Later writes over the same bytes and later syncs are kept as
  // usual. Not set, a failed sync's writes stay unsynced and the next sync makes them durable.
  void lose_failed_sync_writes();
  // The n-th write blocks (before it touches the image) until a power cut,
  // which it then fails, or until release_held_write(): a store stuck in
  // flight while others go on. write_held() says whether it is blocked now.
  void hold_write(uint64_t n);
  bool write_held() const;
  // Lets the held write go on: it fails (an I/O error, the image untouched)
  // when `fail`, else it is done as any write.
  void release_held_write(bool fail);
  // Every read of a byte in [begin, end) fails (an unreadable block).
  void fail_reads(uint64_t begin, uint64_t end);
  // Every write of a byte in [begin, end) fails.
  void fail_writes(uint64_t begin, uint64_t end);
  // Power is cut at the n-th write: its first tear_bytes bytes (0: none)
  // reach the image, every earlier write not yet synced is undone, and this
  // and all later I/O fail.
  void cut_power_at_write(uint64_t n, uint64_t tear_bytes = 0);
  // Cuts power now: every write since the last sync is undone (the torn
  // part of a cut write stays: it reached the media).
  void power_cut();
  // From now on a power cut keeps each write since the last sync whole or
  // drops it whole, as a generator seeded with `seed` draws (each with
  // probability 1/2), in any order, instead of dropping them all: the
  // writes a store did not sync may reach the media in any order.
  void keep_unsynced_at_cut(uint64_t seed);
  // From now on a cut keeps every write before it, in the order written,
  // synced or not: the process died there (killed, out of memory), the
  // machine did not; what it wrote stays in the page cache or reached the
  // device. (The cut write itself: as cut_power_at_write's tear says.)
  void keep_all_unsynced_at_cut();
  // Each write from now on, as it is counted (before it is applied, cut or failed), is told to `f`
  // with its index (writes()'s count before it), offset and length, on the writing thread, under
  // the device's lock: the order of the calls is the order of the indexes. `f` must not call the
  // device. For a test of several writers that must know the order the device saw
  // (tests/cpp/card_crash_mt_test.cc); set it before any I/O.
  void observe_writes(std::function<void(uint64_t index, uint64_t offset, uint64_t bytes)> f);
  // How many unsynced writes the last power cut kept, and dropped (counted in unsynced_at_cut()).
  uint64_t kept_at_cut() const;
  uint64_t dropped_at_cut() const;
  // The unsynced writes the last power cut met, in write order: the write's index (writes()'s count before it),
  // offset, length and whether the cut kept it (for a failed check's report: tests/cpp/card_crash_mt_test.cc).
  struct CutWrite {
    uint64_t index, offset, bytes;
    bool kept;
  };
  std::vector<CutWrite> unsynced_at_cut() const;

  uint64_t writes() const;     // writes attempted so far
  uint64_t syncs() const;      // syncs run and succeeded (callers grouped into one count once)
  uint64_t syncs_run() const;  // syncs run, failed ones too (fail_sync's count)
  bool dead() const;

 protected:
  // Called as each sync run (the flush) begins, on the thread that runs it, outside the device's lock; a
  // subclass may make the flush take time, as an fdatasync does, so that callers of other threads group into the
  // next run (tests/cpp/card_crash_mt_test.cc: a failed sync then fails steps of several threads).
  virtual void flushing() const {}

 private:
  struct Undo {
    uint64_t offset, index, seq;     // seq: the order applied (applied_ before it); index: the order counted (writes_)
    std::vector<uint8_t> old, data;  // the bytes before the write, and those written
    int state = 0;                   // 0 unsynced; lose_failed_sync_writes: 1 synced, kept in the list behind
                                     // a lost one (undone and redone at a cut), 2 lost
  };
  // The power cut: undoes the unsynced writes, then redoes the ones kept.
  void drop_unsynced_locked() const;
  Status write_once(uint64_t offset, const iovec* iov, int count) const;  // writev, between issue() and wrote()
  bool overlaps(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, uint64_t off, uint64_t n) const;
  void apply_locked(uint64_t offset, const iovec* iov, int count, uint64_t limit) const;

  std::shared_ptr<FaultImage> image_;
  std::string name_;
  mutable std::mutex mu_;
  mutable std::vector<Undo> unsynced_;  // in write order
  mutable uint64_t writes_ = 0, syncs_ = 0;
  mutable uint64_t applied_ = 0;  // writes applied to the image (a held write is counted early, applied late)
  mutable bool dead_ = false, healthy_ = true;
  uint64_t fail_write_n_ = UINT64_MAX, fail_write_tear_ = 0;
  uint64_t fail_sync_n_ = UINT64_MAX;
  uint64_t hold_write_n_ = UINT64_MAX;
  mutable bool held_ = false;
  bool released_ = false, release_fails_ = false;
  mutable std::condition_variable held_cv_;
  mutable uint64_t sync_calls_ = 0;      // syncs run (grouped callers: one)
  mutable GroupSync group_sync_{name_};  // after name_: it is made from it
  uint64_t cut_write_n_ = UINT64_MAX, cut_tear_ = 0;
  bool keep_some_ = false, keep_all_ = false, lose_failed_ = false;
  uint64_t keep_seed_ = 0;
  mutable std::vector<CutWrite> cut_writes_;
  std::function<void(uint64_t, uint64_t, uint64_t)> observer_;
  std::vector<std::pair<uint64_t, uint64_t>> bad_reads_, bad_writes_;
};

// A FaultDevice whose next flush after hold_next() waits, once begun, until release(): a write can be applied, or a
// worker's next store written, while a sync runs (group_sync_test, sync_overlap_test).
class HeldFlushDevice : public FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  void hold_next() const {
    std::lock_guard<std::mutex> l(hold_mu_);
    hold_armed_ = true;
  }
  // Until the held flush is in; false after `limit` (nothing held).
  bool wait_held(std::chrono::seconds limit = std::chrono::seconds(60)) const {
    std::unique_lock<std::mutex> l(hold_mu_);
    return hold_cv_.wait_for(l, limit, [this] { return holding_; });
  }
  void release() const {
    std::lock_guard<std::mutex> l(hold_mu_);
    hold_released_ = true;
    hold_cv_.notify_all();
  }

 protected:
  void flushing() const override {
    std::unique_lock<std::mutex> l(hold_mu_);
    if (!hold_armed_) return;
    hold_armed_ = false;
    holding_ = true;
    hold_cv_.notify_all();
    hold_cv_.wait(l, [this] { return hold_released_; });
  }

 private:
  mutable std::mutex hold_mu_;
  mutable std::condition_variable hold_cv_;
  mutable bool hold_armed_ = false, holding_ = false, hold_released_ = false;
};

// A FaultDevice whose writer (make_writer) holds each submitted write until its wait(): the write is applied then
// (writev: every fault of FaultDevice's applies, counted and ordered there), after on_wait(offset), if set, ran on
// the waiting thread. Its writer says a write is in flight until its wait(), so that a store prepares its next object
// while one is held (tests/cpp/write_ahead_test.cc). Writes other than a writer's are made at once, as FaultDevice's.
class DeferredWriteDevice : public FaultDevice {
 public:
  using FaultDevice::FaultDevice;
  // Set before any store; `f` may call the device (fail_write(writes()) fails the write it is told of).
  void on_wait(std::function<void(uint64_t offset)> f) { on_wait_ = std::move(f); }
  std::unique_ptr<DeviceWriter> make_writer() const override { return std::make_unique<Writer>(*this); }
  // Writes submitted through writers, and waited for (equal when none is held).
  uint64_t submitted() const { return submitted_.load(); }
  uint64_t waited() const { return waited_.load(); }

 private:
  class Writer : public DeviceWriter {
   public:
    explicit Writer(const DeferredWriteDevice& dev) : dev_(dev) {}
    bool in_flight() const override { return held_; }
    void submit(uint64_t offset, const iovec* iov, int count) override {
      iov_.assign(iov, iov + count);
      offset_ = offset;
      dev_.submitted_++;
      held_ = true;
    }
    Status wait() override {
      held_ = false;
      dev_.waited_++;
      if (dev_.on_wait_) dev_.on_wait_(offset_);
      return dev_.writev(offset_, iov_.data(), static_cast<int>(iov_.size()));
    }

   private:
    const DeferredWriteDevice& dev_;
    std::vector<iovec> iov_;
    uint64_t offset_ = 0;
    bool held_ = false;
  };
  std::function<void(uint64_t)> on_wait_;
  mutable std::atomic<uint64_t> submitted_{0}, waited_{0};
};

}  // namespace adp::testing
