// SPDX-License-Identifier: Apache-2.0
// A byte amount as log lines and messages write it.
#pragma once

#include <cstdint>
#include <string>

namespace adp {

// "1.50 GiB" from 1 GiB up, "48.00 MiB" below, so a small card reads
// "12.00 MiB", not "0.01 GiB" (audit 14 item 12).
std::string log_amount(uint64_t bytes);

}  // namespace adp
