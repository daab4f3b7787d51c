// SPDX-License-Identifier: Apache-2.0
// Device: the narrow interface the card store does its I/O through (as
// CacheLib Navy's Device): positional reads and writes of whole 4 KiB blocks,
// and sync. CardDevice is the real card (O_DIRECT); testing/fault_device.h is
// a test double that fails chosen I/O, tears writes and cuts power.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace adp {

// A store, load or delete of a device in flight, for this object's life
// (Device::begin_foreground; CardStore's put, get, get_via_bounce and
// remove): a background pass of the device over itself (CardDevice's
// prefault) leaves the kernel to it between its pieces, for a bounded time.
// It holds the device's count of them (an atomic, shared), not the device:
// an operation that a stopped gateway left behind (its thread out of the
// card gate, waiting on its client, when the card was closed and freed:
// review r7 B1, gateway/client_handler.h's CardGate) ends after the device
// is gone and touches nothing of it. Session 24's first form called the
// device from its destructor: a heap use after free there (asan25).
class Foreground {
 public:
  explicit Foreground(std::shared_ptr<std::atomic<int>> count) : count_(std::move(count)) {
    if (count_) count_->fetch_add(1, std::memory_order_relaxed);
  }
  ~Foreground() {
    if (count_) count_->fetch_sub(1, std::memory_order_relaxed);
  }
  Foreground(const Foreground&) = delete;
  Foreground& operator=(const Foreground&) = delete;

 private:
  const std::shared_ptr<std::atomic<int>> count_;  // nullptr: nobody looks (a device without background work)
};

// One write at a time, issued by its owner and waited for later (Device::writer): the owner prepares its next write
// (a store's copy and CRC: CardStore::put_each) while this one is in flight. One owner (an IoContext's thread);
// at most one write in flight (the same I/O concurrency as a synchronous write a thread).
class DeviceWriter {
 public:
  virtual ~DeviceWriter() = default;
  // Issues the write of iov's bytes at `offset` (Device::writev's rules). The memory iov points to stays valid and
  // unchanged until wait() returns (the iovec array itself only for the call). One in flight: wait() first.
  virtual void submit(uint64_t offset, const iovec* iov, int count) = 0;
  // The result of the write submitted (once for each submit): it is complete (and counted as completed for
  // Device::sync) when this returns.
  virtual Status wait() = 0;
  // True while the write submitted last is in flight (submit() only issued it, wait() not yet called); false when it
  // was made in submit() (a synchronous writer, or an AIO writer whose io_submit failed) or once waited for.
  virtual bool in_flight() const { return false; }
};

class Device;

// The default DeviceWriter: Device::writev in submit(), its result kept for wait(). Every test device keeps its
// faults (testing/fault_device.h: a crash at any write, a failed write) and its order of writes.
class SyncDeviceWriter : public DeviceWriter {
 public:
  explicit SyncDeviceWriter(const Device& dev) : dev_(dev) {}
  void submit(uint64_t offset, const iovec* iov, int count) override;
  Status wait() override { return std::move(result_); }

 private:
  const Device& dev_;
  Status result_;
};

class Device {
 public:
  virtual ~Device() = default;
  // For messages: where the card is.
  virtual const std::string& path() const = 0;
  // Bytes of the device.
  virtual uint64_t size() const = 0;
  // Thread-safe; offsets, lengths and memory 4 KiB-aligned.
  virtual Status readv(uint64_t offset, const iovec* iov, int count) const = 0;
  virtual Status writev(uint64_t offset, const iovec* iov, int count) const = 0;
  // The device's count of issued writes (counted before each write's
  // syscall): noted before a caller's first write, or before the first write
  // its own depends on, and passed to sync() (util/group_sync.h).
  virtual uint64_t write_mark() const = 0;
  // Makes completed writes durable against power loss. Fails too where a
  // failed sync may have lost a write issued after `since` (write_mark()):
  // a failed sync may lose for good every write issued before it returned,
  // and a later one that succeeds does not bring them back
  // (docs/card_format.md, Writing).
  virtual Status sync(uint64_t since) const = 0;
  // True when a failed sync may have lost a write issued after `since`
  // (write_mark()): one atomic load.
  virtual bool lost_after(uint64_t since) const = 0;
  // False while the card fails I/O (CardDevice: util/failing_hold.h).
  virtual bool healthy() const = 0;
  // True when the device is memory (an image on tmpfs/ramfs): a read takes a
  // memcpy's time.
  virtual bool memory_backed() const { return false; }
  // The whole device mapped (size() bytes), or nullptr. Only a
  // memory-backed device maps itself: a load then copies its payload from
  // the mapping into the caller's buffer, checking the CRC in the same pass,
  // and a store copies into it, instead of the kernel copying page by page
  // (one file's writes one at a time) and the CRC reading the bytes again.
  // Valid for the device's lifetime.
  virtual uint8_t* mapped() const { return nullptr; }
  // Allocates and maps the pages of [offset, offset + n) for writing through
  // mapped(). False if it cannot (a full tmpfs): the caller then uses
  // writev, which reports the error, where a store into an unallocatable
  // page of the mapping would be SIGBUS.
  virtual bool prepare_mapped_write(uint64_t offset, size_t n) const {
    (void)offset, (void)n;
    return false;
  }
  // The store has copied the bytes [offset, offset + n) into mapped(); it
  // calls this after each copy, in the order of its copies (a record's
  // payload pieces, then the header's writev). Nothing to do for a real
  // mapping: the bytes are in the page cache. A test double
  // (testing/mapped_fault_device.h) counts each as a write, to cut a process
  // crash between them.
  virtual void mapped_written(uint64_t offset, size_t n) const { (void)offset, (void)n; }
  // A store, load or delete of the card in flight for the returned object's
  // life (Foreground, which may outlive the device). Thread-safe. Counted
  // only where background work looks at it (CardDevice).
  [[nodiscard]] virtual Foreground begin_foreground() const { return Foreground(nullptr); }
  // Stops the device's background work (CardDevice's prefault) within one of
  // its pieces, for good: a closing store's last writes (the frontier's pad)
  // do not meet it.
  virtual void stop_background() {}

  // A writer of this device for one thread (an IoContext's), made once and kept: it may hold a kernel context
  // (CardDevice: a Linux AIO context). Default: SyncDeviceWriter. Never nullptr.
  virtual std::unique_ptr<DeviceWriter> make_writer() const { return std::make_unique<SyncDeviceWriter>(*this); }

  Status read(uint64_t offset, void* buf, size_t n) const {
    iovec v{buf, n};
    return readv(offset, &v, 1);
  }
  Status write(uint64_t offset, const void* buf, size_t n) const {
    iovec v{const_cast<void*>(buf), n};
    return writev(offset, &v, 1);
  }
};

inline void SyncDeviceWriter::submit(uint64_t offset, const iovec* iov, int count) {
  result_ = dev_.writev(offset, iov, count);
}

}  // namespace adp
