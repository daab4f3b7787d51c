// SPDX-License-Identifier: Apache-2.0
#include "util/amount.h"

#include <cstdio>

namespace adp {

std::string log_amount(uint64_t bytes) {
  char b[32];
  if (bytes >= (1ull << 30))
    std::snprintf(b, sizeof b, "%.2f GiB", bytes / double(1ull << 30));
  else
    std::snprintf(b, sizeof b, "%.2f MiB", bytes / double(1ull << 20));
  return b;
}

}  // namespace adp
