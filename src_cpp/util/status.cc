// SPDX-License-Identifier: Apache-2.0
#include "util/status.h"

#include <cstring>

namespace adp {

std::string errno_text(int err) {
  char buf[128];
  return std::string(strerror_r(err, buf, sizeof buf));  // GNU strerror_r
}

}  // namespace adp
