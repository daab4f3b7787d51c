// SPDX-License-Identifier: Apache-2.0
#include "testing/mapped_fault_device.h"

#include <cstdlib>
#include <cstring>

#include "store/card_format.h"

namespace adp::testing {

MappedFaultDevice::MappedFaultDevice(std::shared_ptr<FaultImage> image, std::string name)
    : FaultDevice(image, std::move(name)),
      map_(static_cast<uint8_t*>(std::aligned_alloc(kBlockSize, image->data.size())), &std::free),
      size_(image->data.size()) {
  if (!map_) std::abort();  // a test's image: tens of MiB
  std::memcpy(map_.get(), image->data.data(), size_);
}

bool MappedFaultDevice::prepare_mapped_write(uint64_t offset, size_t n) const { return offset + n <= size_; }

Status MappedFaultDevice::writev(uint64_t offset, const iovec* iov, int count) const {
  Status s = FaultDevice::writev(offset, iov, count);
  if (!s.ok()) return s;  // (a torn or cut write's bytes: the image says what landed; the process is gone)
  uint8_t* dst = map_.get() + offset;
  for (int i = 0; i < count; i++) {
    std::memcpy(dst, iov[i].iov_base, iov[i].iov_len);
    dst += iov[i].iov_len;
  }
  return s;
}

void MappedFaultDevice::mapped_written(uint64_t offset, size_t n) const {
  // The whole blocks the copy touched (the image takes whole blocks).
  const uint64_t begin = offset / kBlockSize * kBlockSize;
  const uint64_t end = (offset + n + kBlockSize - 1) / kBlockSize * kBlockSize;
  iovec v{map_.get() + begin, end - begin};
  (void)FaultDevice::writev(begin, &v, 1);  // a copy cannot fail: a cut here is the process gone
}

}  // namespace adp::testing
