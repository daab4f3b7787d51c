// SPDX-License-Identifier: Apache-2.0
// Token check of the TCP handshake.
#pragma once

#include <string_view>

namespace adp::proto {

// Compares in time that depends only on the expected token's length, so a
// peer cannot find the token byte by byte from response times.
inline bool token_matches(std::string_view presented, std::string_view expected) {
  unsigned diff = presented.size() != expected.size();
  for (size_t i = 0; i < expected.size(); i++)
    diff |=
        static_cast<unsigned char>(i < presented.size() ? presented[i] : 0) ^ static_cast<unsigned char>(expected[i]);
  return diff == 0;
}

}  // namespace adp::proto
