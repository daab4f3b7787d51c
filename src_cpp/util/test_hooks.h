// SPDX-License-Identifier: Apache-2.0
// The ADP_TEST_* environment variables: hooks that make the gateway or the
// connector slow, stall, or count CPUs differently, for tests only. Read in
// this one place (read_test_hooks), once when a gateway starts
// (GatewayServer::Start, kept in GatewayShared) or a connector does (the
// Connector and its RemoteBackend), never per connection or request; each
// hook set is logged at WARNING then (warn_test_hooks). A test sets them
// before that start. The list, with what each does: docs/testing.md.
#pragma once

#include <string>
#include <vector>

namespace adp {

enum class HookSide { kGateway, kConnector, kBoth };

struct TestHooks {
  // The gateway's (its connections read them from GatewayShared::hooks).
  int gateway_cpus = 0;                      // ADP_TEST_GATEWAY_CPUS (> 0: used)
  int ring_piece_delay_ms = 0;               // ADP_TEST_RING_PIECE_DELAY_MS
  int segment_write_delay_ms = 0;            // ADP_TEST_SEGMENT_WRITE_DELAY_MS
  int process_write_stall_ms = 0;            // ADP_TEST_PROCESS_WRITE_STALL_MS
  bool process_stall_on_helper = false;      // ADP_TEST_PROCESS_WRITE_STALL_ON=helper
  int process_read_stall_ms = 0;             // ADP_TEST_PROCESS_READ_STALL_MS
  bool process_read_stall_at_start = false;  // ADP_TEST_PROCESS_READ_STALL_AT=start
  int process_read_piece_delay_ms = 0;       // ADP_TEST_PROCESS_READ_PIECE_DELAY_MS
  int pipeline_retry_ms = -1;                // ADP_TEST_PIPELINE_RETRY_MS (-1: not set)
  int loader_idle_ms = -1;                   // ADP_TEST_LOADER_IDLE_MS (-1: not set)
  int pipeline_wake_delay_ms = 0;            // ADP_TEST_PIPELINE_WAKE_DELAY_MS
  int hang_up_wait_ms = -1;                  // ADP_TEST_HANG_UP_WAIT_MS (-1: not set)
  bool segment_populate_einval = false;      // ADP_TEST_SEGMENT_POPULATE_EINVAL=1
  int conn_end_delay_ms = 0;                 // ADP_TEST_CONN_END_DELAY_MS
  int teardown_delay_ms = 0;                 // ADP_TEST_TEARDOWN_DELAY_MS
  int hello_ok_delay_ms = 0;                 // ADP_TEST_HELLO_OK_DELAY_MS
  std::string socket_bind_gate;              // ADP_TEST_SOCKET_BIND_GATE
  bool socket_refuse_chmod = false;          // ADP_TEST_SOCKET_REFUSE_CHMOD=1
  std::string accept_thread_fail;            // ADP_TEST_ACCEPT_THREAD_FAIL (system or alloc; empty: not set)
  std::string store_reader_fail;             // ADP_TEST_STORE_READER_FAIL (post, job or read; empty: not set)
  // Both sides': the spin load rule's (util/idle_cpus.h), set at a gateway's or connector's start.
  std::string loadavg_file;     // ADP_TEST_LOADAVG_FILE (empty: /proc/loadavg)
  int spin_load_every_ms = -1;  // ADP_TEST_SPIN_LOAD_EVERY_MS (-1: not set, kIdleCpusEvery)
  std::string cpu_max_file;     // ADP_TEST_CPU_MAX_FILE (empty: the cgroup's own quota)
  // Both sides': a process's card health hold (util/failing_hold.h), set at its start.
  int card_failing_hold_ms = -1;  // ADP_TEST_CARD_FAILING_HOLD_MS (-1: not set, kFailingHold)
  // The connector's.
  int delivery_delay_ms = 0;       // ADP_TEST_DELIVERY_DELAY_MS
  int put_copy_delay_ms = 0;       // ADP_TEST_PUT_COPY_DELAY_MS
  int stall_log_interval_ms = -1;  // ADP_TEST_STALL_LOG_INTERVAL_MS (-1: not set, kStallLogInterval)
  int stall_check_ms = -1;         // ADP_TEST_STALL_CHECK_MS (<= 0: not set, kStallCheck)
  int yama_ptrace_scope = -1;      // ADP_TEST_YAMA_PTRACE_SCOPE (-1: not set)
  int idle_check_ms = -1;          // ADP_TEST_IDLE_CHECK_MS (-1: not set, kIdleCheck)
  int client_cpus = 0;             // ADP_TEST_CLIENT_CPUS (> 0: used)
  int max_backoff_ms = -1;         // ADP_TEST_MAX_BACKOFF_MS (<= 0: not set, kMaxBackoff)
  int idle_look_ms = -1;           // ADP_TEST_IDLE_LOOK_MS (<= 0: not set, kIdleLook)
  bool no_procmap_query = false;   // ADP_TEST_NO_PROCMAP_QUERY=1
  bool no_peer_pidfd = false;      // ADP_TEST_NO_PEER_PIDFD=1

  // Each hook set, as found: its name, value, side and what it does.
  struct Set {
    std::string name, value;
    HookSide side;
    const char* what;
  };
  std::vector<Set> set;
  // The ADP_TEST_ names of the environment that no hook has (each does nothing), as found.
  std::vector<std::string> unknown;
};

// Reads every ADP_TEST_ hook from the environment (a number as atoi reads it).
TestHooks read_test_hooks();

// One WARNING for each hook of `side` that is set: "<gateway|connector>: test
// hook NAME=value is set (what it does): this process is not for production";
// and one for each unknown ADP_TEST_ name (TestHooks::unknown), once per
// process and name: "<side>: NAME is set but is not a known test hook: it
// does nothing (...)".
void warn_test_hooks(const TestHooks& hooks, HookSide side);

// The names of every hook (the table read_test_hooks reads), for the tests'
// check of the environment they start with (tests/conftest.py).
std::vector<std::string> known_test_hooks();

// Sets this process's card health hold (failing_hold_ms) from `hooks`:
// ADP_TEST_CARD_FAILING_HOLD_MS if set, else kFailingHold.
void apply_failing_hold(const TestHooks& hooks);

}  // namespace adp
