// SPDX-License-Identifier: Apache-2.0
// Status: an error as a value (ok, or a code and a message), as in LevelDB.
// Layers return it instead of throwing; only the Python boundary raises.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace adp {

class Status {
 public:
  enum class Code {
    kOk,
    kNotFound,
    kInvalidArgument,
    kNoSpace,
    kIoError,
    kCorruption,
    kTimedOut,
    kBusy,
    kClosed,
    kUnavailable
  };

  // Where an I/O error comes from (protocol r9, review r10 N5): the card,
  // the gateway's own memory, or a client's memory read or written with
  // process_vm_readv/writev. kUnsaid: not marked where it was made (a
  // gateway sends it as the card's, as the connector's message rule of r8
  // and older reads it), or decoded from a reply that carried no class.
  enum class IoClass : uint8_t { kUnsaid = 0, kCard = 1, kGatewayMemory = 2, kClientMemory = 3 };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status NotFound(std::string m = "not found") { return Status(Code::kNotFound, std::move(m)); }
  static Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
  static Status NoSpace(std::string m) { return Status(Code::kNoSpace, std::move(m)); }
  static Status IoError(std::string m, IoClass c = IoClass::kUnsaid) {
    Status s(Code::kIoError, std::move(m));
    s.io_class_ = c;
    return s;
  }
  static Status Corruption(std::string m) { return Status(Code::kCorruption, std::move(m)); }
  static Status TimedOut(std::string m) { return Status(Code::kTimedOut, std::move(m)); }
  static Status Busy(std::string m) { return Status(Code::kBusy, std::move(m)); }
  static Status Closed(std::string m) { return Status(Code::kClosed, std::move(m)); }
  static Status Unavailable(std::string m) { return Status(Code::kUnavailable, std::move(m)); }

  bool ok() const { return code_ == Code::kOk; }
  bool is_not_found() const { return code_ == Code::kNotFound; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  IoClass io_class() const { return io_class_; }  // kUnsaid unless an I/O error marked so

 private:
  Status(Code c, std::string m) : code_(c), msg_(std::move(m)) {}
  Code code_ = Code::kOk;
  IoClass io_class_ = IoClass::kUnsaid;
  std::string msg_;
};

// errno as text, for I/O error messages.
std::string errno_text(int err);

}  // namespace adp
