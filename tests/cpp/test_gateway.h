// SPDX-License-Identifier: Apache-2.0
// The in-process gateway of the C++ test programs of tests/cpp that drive one
// with raw_client.h: the program's directory argument (tmpfs: its card image
// and socket), the gateway's options there, its start and its stop, each
// failure a CHECK (check.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>

#include "check.h"
#include "gateway/gateway_server.h"

namespace adp::testing {

// The program's one argument, DIR; false (the usage printed) when it was not given.
inline bool dir_argument(int argc, char** argv, std::string* dir) { return one_argument(argc, argv, "DIR", dir); }

// A gateway on DIR/card<suffix>.img, created with `card_mib` MiB (0: the image exists), listening on
// DIR/gw<suffix>.sock, with `helpers` piece helpers (process_write_threads).
inline GatewayOptions gateway_options(const std::string& dir, size_t card_mib, int helpers,
                                      const std::string& suffix = "") {
  GatewayOptions go;
  go.card.path = dir + "/card" + suffix + ".img";
  go.card.create_bytes = card_mib << 20;
  go.socket_path = dir + "/gw" + suffix + ".sock";
  go.process_write_threads = helpers;
  return go;
}

// The gateway started with `go` (its test hooks are read now: util/test_hooks.h); nullptr, a CHECK
// failed, if it did not start.
inline std::unique_ptr<GatewayServer> start_gateway(const GatewayOptions& go) {
  std::unique_ptr<GatewayServer> gw;
  Status s = GatewayServer::Start(go, &gw);
  CHECK(s.ok(), "start the gateway on %s: %s", go.card.path.c_str(), s.message().c_str());
  if (!s.ok()) return nullptr;
  return gw;
}

// stop(), then waits for it; a CHECK that it finished within 30 s.
inline void stop_gateway(GatewayServer& gw) {
  gw.stop();
  CHECK(gw.wait(std::chrono::seconds(30)), "stop() did not finish within 30 s");
}

}  // namespace adp::testing
