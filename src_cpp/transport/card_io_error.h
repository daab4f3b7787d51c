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
// process_vm_writev of the client's memory (ENOMEM and the like). Since r9 a
// gateway sends each I/O error's class (kFeatureErrorClass) to a connector
// that asks; these starts are the rule for a gateway of r8 or older, which
// sends no class (review r10 N5: a status code an older connector does not
// know makes its whole reply malformed, protocol/messages.cc, hence a class
// behind a feature bit). A gateway of r9 still makes these messages, for the
// connectors of r8 and older that read them. Pinned by
// tests/gateway/test_card_io_error.py: the gateway's sources still make
// these messages, with the class, and every I/O error of theirs about memory
// starts with one of these.
inline constexpr std::string_view kNotCardIoErrors[] = {"out of memory", "process_vm_"};

// An I/O error of the card: by its class where the gateway sent one (r9),
// else by its message (any I/O error except those above).
inline bool card_io_error(const Status& st) {
  if (st.code() != Status::Code::kIoError) return false;
  switch (st.io_class()) {
    case Status::IoClass::kCard:
      return true;
    case Status::IoClass::kGatewayMemory:
    case Status::IoClass::kClientMemory:
      return false;
    case Status::IoClass::kUnsaid:
      break;
  }
  for (const std::string_view p : kNotCardIoErrors)
    if (st.message().starts_with(p)) return false;
  return true;
}

}  // namespace adp
