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
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
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

// Completions drained by wait_for for futures other than the one it waited
// for, kept for their own wait: by connector, then future id. A connector's
// entry goes when its last kept completion is taken (forget() drops one
// whose futures will not be waited for, before the connector is destroyed:
// a later connector at the same address numbers its futures from 1 again).
struct KeptCompletions {
  std::mutex mu;
  std::map<const Connector*, std::map<uint64_t, Completion>> by_connector;
};
inline KeptCompletions& kept_completions() {
  static KeptCompletions kept;
  return kept;
}

// Takes the kept completion of c's future `id`, if there is one.
inline std::optional<Completion> take_kept(const Connector& c, uint64_t id) {
  KeptCompletions& k = kept_completions();
  std::lock_guard<std::mutex> lock(k.mu);
  auto conn = k.by_connector.find(&c);
  if (conn == k.by_connector.end()) return std::nullopt;
  auto it = conn->second.find(id);
  if (it == conn->second.end()) return std::nullopt;
  Completion done = std::move(it->second);
  conn->second.erase(it);
  if (conn->second.empty()) k.by_connector.erase(conn);
  return done;
}

// Drops what is kept for c (its futures' completions nobody waited for).
inline void forget(const Connector& c) {
  KeptCompletions& k = kept_completions();
  std::lock_guard<std::mutex> lock(k.mu);
  k.by_connector.erase(&c);
}

// The completion of c's future `id`, waiting on c's event fd. The completions
// of other futures drained meanwhile are kept for their own wait_for
// (several futures waited for in turn, in any order; threads waiting on the
// same connector). A future not complete after `timeout` ends the program
// (exit 1: nothing after it can be checked).
inline Completion wait_for(Connector& c, uint64_t id, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (std::optional<Completion> done = take_kept(c, id)) return std::move(*done);
    std::optional<Completion> mine;
    {
      std::vector<Completion> drained = c.drain();
      KeptCompletions& k = kept_completions();
      std::lock_guard<std::mutex> lock(k.mu);
      for (auto& done : drained) {
        if (done.future_id == id)
          mine = std::move(done);
        else
          k.by_connector[&c][done.future_id] = std::move(done);
      }
    }
    if (mine) return std::move(*mine);
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

// Submits a store of two 64 KiB keys, key(b, 0) and key(b, 1), their bytes pattern(2b + i) appended to `values`
// (reserved by the caller: the buffers point into it until the future completes); returns the future's id.
template <typename KeyFn>
uint64_t submit_two_keys(Connector& c, const KeyFn& key, int b, std::vector<std::vector<uint8_t>>& values) {
  std::vector<std::string> keys;
  std::vector<Buffer> bufs;
  for (int i = 0; i < 2; i++) {
    keys.push_back(key(b, i));
    values.push_back(pattern(64 << 10, static_cast<uint8_t>(2 * b + i)));
    bufs.push_back({values.back().data(), values.back().size()});
  }
  return c.submit(OpType::kSet, std::move(keys), std::move(bufs), nullptr);
}

}  // namespace adp::testing
