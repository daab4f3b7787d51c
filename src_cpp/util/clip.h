// SPDX-License-Identifier: Apache-2.0
// clip_utf8: text cut to a byte bound without splitting a UTF-8 character, for
// error text that reaches Python (pybind11 decodes a std::string as strict
// UTF-8: a character cut in half would make the completion's str() raise).
#pragma once

#include <cstddef>
#include <string_view>

namespace adp {

// The first max_bytes bytes of s at most, shortened further to end before a
// UTF-8 character that the bound cuts (its continuation bytes 10xxxxxx are
// dropped with its lead byte). Text that is not UTF-8 is cut at the bound or
// at most 3 bytes before it.
inline std::string_view clip_utf8(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes;
  // s[n] is the first byte left out: while it continues a character, that character is cut: end before its lead.
  for (int back = 0; back < 3 && n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80; back++) n--;
  if (n < max_bytes && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) n = max_bytes;
  return s.substr(0, n);
}

}  // namespace adp
