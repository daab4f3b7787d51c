// SPDX-License-Identifier: Apache-2.0
// The Connector of the C++ test programs of tests/cpp that drive one over the
// embedded backend: made on a card store, and one request submitted and
// waited for as LMCache's adapter waits (the event fd, then drain()). Beside
// test_card.h (the card store) and test_gateway.h (an in-process gateway).
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "connector/connector.h"
#include "store/card_store.h"
#include "transport/embedded_backend.h"

namespace adp::testing {

// A Connector over the embedded backend on `store`, with `workers` workers and requests timing out after
// `timeout_ms`.
inline std::unique_ptr<Connector> embedded_connector(std::shared_ptr<CardStore> store, int workers, int timeout_ms) {
  ConnectorOptions opts;
  opts.num_workers = workers;
  opts.timeout_ms = timeout_ms;
  return std::make_unique<Connector>(std::make_unique<EmbeddedBackend>(std::move(store)), opts);
}

// The completion of c's future `id`, waiting on c's event fd. The completions of other futures drained
// meanwhile are dropped: a caller waits for each request before it submits the next. A future not
// complete after 60 s ends the program (exit 1: nothing after it can be checked).
inline Completion wait_for(Connector& c, uint64_t id) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    for (auto& done : c.drain())
      if (done.future_id == id) return std::move(done);
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("future %llu did not complete\n", static_cast<unsigned long long>(id));
      std::exit(1);
    }
    pollfd p{c.event_fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
  }
}

// Submits `op` on `keys` (with `bufs`, one a key, for a get or a set) and waits for its completion.
inline Completion run(Connector& c, OpType op, std::vector<std::string> keys, std::vector<Buffer> bufs = {}) {
  return wait_for(c, c.submit(op, std::move(keys), std::move(bufs), nullptr));
}

}  // namespace adp::testing
