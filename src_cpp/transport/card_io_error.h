// SPDX-License-Identifier: Apache-2.0
// Whether a gateway's answer to one item is its card failing I/O (the
// connector's gateway_card_healthy, /health).
#pragma once

#include <string_view>

#include "util/status.h"

namespace adp {

// The starts of the I/O errors a gateway answers that are not its card's:
// its own memory (review r9 H2: "out of memory for the store buffer of ...",
// "... for staging", "... for a bounce buffer") and a process_vm_readv or
// process_vm_writev of the client's memory (ENOMEM and the like). The gateway
// sends no other sign: the wire has no error class, and a status code a
// connector does not know makes the whole reply malformed to it
// (protocol/messages.cc), so a new one would need a feature bit (review r10
// N5). Pinned by tests/gateway/test_card_io_error.py: the gateway's sources
// still make these messages, and every I/O error of theirs about memory
// starts with one of these.
inline constexpr std::string_view kNotCardIoErrors[] = {"out of memory", "process_vm_"};

// An I/O error, except those above.
inline bool card_io_error(const Status& st) {
  if (st.code() != Status::Code::kIoError) return false;
  for (const std::string_view p : kNotCardIoErrors)
    if (st.message().starts_with(p)) return false;
  return true;
}

}  // namespace adp
