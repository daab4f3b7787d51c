// SPDX-License-Identifier: Apache-2.0
#include "protocol/frame.h"

#include <string>

namespace adp::proto {

FrameHeader make_header(FrameType type, uint64_t request_id, size_t body_bytes) {
  return FrameHeader{kFrameMagic, kProtocolVersion, static_cast<uint8_t>(type), 0, static_cast<uint32_t>(body_bytes),
                     0,           request_id};
}

Status check_header(const FrameHeader& h, uint32_t max_body) {
  if (h.magic != kFrameMagic) return Status::InvalidArgument("bad frame magic");
  if (h.version != kProtocolVersion)
    return Status::InvalidArgument(kOtherVersion + std::to_string(h.version) + " (this side speaks " +
                                   std::to_string(kProtocolVersion) + ")");
  if (h.flags != 0 || h.reserved != 0) return Status::InvalidArgument("reserved header fields are not zero");
  if (h.type < static_cast<uint8_t>(FrameType::kHello) || h.type > static_cast<uint8_t>(FrameType::kAlive))
    return Status::InvalidArgument("unknown frame type " + std::to_string(h.type));
  if (h.body_bytes > max_body)
    return Status::InvalidArgument("frame body of " + std::to_string(h.body_bytes) + " bytes exceeds the bound of " +
                                   std::to_string(max_body));
  return Status::Ok();
}

}  // namespace adp::proto
