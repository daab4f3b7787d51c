// SPDX-License-Identifier: Apache-2.0
// MappedFaultDevice: a FaultDevice that is a tmpfs card with its mapping
// (CardDevice on /dev/shm): memory-backed, mapped() a copy of the image the
// device owns. The store copies a payload into the mapping and then tells
// the device (Device::mapped_written); each such copy is one of the
// device's writes, from the mapping's bytes into the image: counted, and
// cut, failed or kept at a crash as a writev is, in the order the store
// copied. So a process crash between a record's payload copies and its
// header's write is a write point of the crash harness
// (tests/cpp/crash_harness.h). Writes through writev (headers, pads,
// tombstones) land in the mapping as well as the image, as on tmpfs.
// (A power cut loses a tmpfs card whole; a process crash, every write before
// it kept, is the fault that matters here.)
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "testing/fault_device.h"

namespace adp::testing {

class MappedFaultDevice : public FaultDevice {
 public:
  explicit MappedFaultDevice(std::shared_ptr<FaultImage> image, std::string name = "mapped-fault-device");

  bool memory_backed() const override { return true; }
  uint8_t* mapped() const override { return map_.get(); }
  bool prepare_mapped_write(uint64_t offset, size_t n) const override;
  Status writev(uint64_t offset, const iovec* iov, int count) const override;
  void mapped_written(uint64_t offset, size_t n) const override;

 private:
  std::unique_ptr<uint8_t, decltype(&std::free)> map_;  // 4 KiB aligned (the image takes aligned writes)
  uint64_t size_;
};

}  // namespace adp::testing
