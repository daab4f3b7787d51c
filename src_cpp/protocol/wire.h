// SPDX-License-Identifier: Apache-2.0
// ByteWriter / ByteReader: little-endian fields in a byte buffer. The reader
// never reads past its end: a short buffer sets a sticky failure and yields
// zeros, so a decoder checks ok() once at the end of a message.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace adp::proto {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_->insert(out_->end(), p, p + sizeof v);
  }
  void bytes(std::string_view s) { out_->insert(out_->end(), s.begin(), s.end()); }

 private:
  std::vector<uint8_t>* out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  T get() {
    static_assert(std::is_integral_v<T>);
    T v{};
    if (!take(sizeof v)) return v;
    std::memcpy(&v, in_.data() + pos_ - sizeof v, sizeof v);
    return v;
  }
  std::string_view text(size_t n) {
    if (!take(n)) return {};
    return {reinterpret_cast<const char*>(in_.data() + pos_ - n), n};
  }
  std::span<const uint8_t> rest() {
    auto r = in_.subspan(pos_);
    pos_ = in_.size();
    return r;
  }
  size_t remaining() const { return in_.size() - pos_; }
  bool ok() const { return ok_; }

 private:
  bool take(size_t n) {
    if (!ok_ || n > in_.size() - pos_) return ok_ = false;
    pos_ += n;
    return true;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace adp::proto
