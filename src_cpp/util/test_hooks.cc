// SPDX-License-Identifier: Apache-2.0
#include "util/test_hooks.h"

#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <string_view>

#include "util/failing_hold.h"
#include "util/log.h"

namespace adp {
namespace {

struct Hook {
  const char* name;
  HookSide side;
  const char* what;
  void (*take)(TestHooks& h, const char* v);
};

// Every hook: docs/testing.md lists the same (tests/util/test_test_hooks.py checks it).
constexpr Hook kHooks[] = {
    {"ADP_TEST_GATEWAY_CPUS", HookSide::kGateway,
     "the piece helpers and the store pipeline count this many CPUs, not the machine's",
     [](TestHooks& h, const char* v) { h.gateway_cpus = std::atoi(v); }},
    {"ADP_TEST_RING_PIECE_DELAY_MS", HookSide::kGateway, "a pause before each piece of a get read into a ring",
     [](TestHooks& h, const char* v) { h.ring_piece_delay_ms = std::atoi(v); }},
    {"ADP_TEST_SEGMENT_WRITE_DELAY_MS", HookSide::kGateway,
     "a pause before each object copied into or out of a segment or process memory",
     [](TestHooks& h, const char* v) { h.segment_write_delay_ms = std::atoi(v); }},
    {"ADP_TEST_PROCESS_WRITE_STALL_MS", HookSide::kGateway,
     "the first process write past an object's first piece stalls this long",
     [](TestHooks& h, const char* v) { h.process_write_stall_ms = std::atoi(v); }},
    {"ADP_TEST_PROCESS_WRITE_STALL_ON", HookSide::kGateway, "helper: those stalls only on a piece helper",
     [](TestHooks& h, const char* v) { h.process_stall_on_helper = std::string_view(v) == "helper"; }},
    {"ADP_TEST_PROCESS_READ_STALL_MS", HookSide::kGateway,
     "the first process read past an object's first piece stalls this long",
     [](TestHooks& h, const char* v) { h.process_read_stall_ms = std::atoi(v); }},
    {"ADP_TEST_PROCESS_READ_STALL_AT", HookSide::kGateway, "start: that stall is at an object's first piece",
     [](TestHooks& h, const char* v) { h.process_read_stall_at_start = std::string_view(v) == "start"; }},
    {"ADP_TEST_PROCESS_READ_PIECE_DELAY_MS", HookSide::kGateway, "a pause in each piece a store reader reads",
     [](TestHooks& h, const char* v) { h.process_read_piece_delay_ms = std::atoi(v); }},
    {"ADP_TEST_PIPELINE_RETRY_MS", HookSide::kGateway,
     "a connection pipelines its stores again this long after a stall (30 s)",
     [](TestHooks& h, const char* v) { h.pipeline_retry_ms = std::atoi(v); }},
    {"ADP_TEST_LOADER_IDLE_MS", HookSide::kGateway,
     "a connection stops counting as loading after this long idle (20 ms)",
     [](TestHooks& h, const char* v) { h.loader_idle_ms = std::atoi(v); }},
    {"ADP_TEST_PIPELINE_WAKE_DELAY_MS", HookSide::kGateway,
     "a pipelined store's thread waits this long after its reader's first piece, out of the card gate",
     [](TestHooks& h, const char* v) { h.pipeline_wake_delay_ms = std::atoi(v); }},
    {"ADP_TEST_HANG_UP_WAIT_MS", HookSide::kGateway,
     "a client that sent its Hello and shut down its sending side, and no request, is given this long to hang up "
     "(200 ms)",
     [](TestHooks& h, const char* v) { h.hang_up_wait_ms = std::atoi(v); }},
    {"ADP_TEST_SEGMENT_POPULATE_EINVAL", HookSide::kGateway,
     "1: MADV_POPULATE_WRITE (segment loads, tmpfs card stores) is refused, as by a kernel before 5.14",
     [](TestHooks& h, const char* v) { h.segment_populate_einval = std::string_view(v) == "1"; }},
    {"ADP_TEST_CONN_END_DELAY_MS", HookSide::kGateway,
     "a connection's thread ends this long after its teardown (its connection given back)",
     [](TestHooks& h, const char* v) { h.conn_end_delay_ms = std::atoi(v); }},
    {"ADP_TEST_TEARDOWN_DELAY_MS", HookSide::kGateway,
     "a connection that ended (its client closed it, say) is given back this long later",
     [](TestHooks& h, const char* v) { h.teardown_delay_ms = std::atoi(v); }},
    {"ADP_TEST_HELLO_OK_DELAY_MS", HookSide::kGateway,
     "a client's connection waits this long after its HelloOk went out before it reads its first request",
     [](TestHooks& h, const char* v) { h.hello_ok_delay_ms = std::atoi(v); }},
    {"ADP_TEST_SOCKET_BIND_GATE", HookSide::kGateway,
     "the Unix socket, bound, waits for this file to exist (60 s at most) before its chmod and listen",
     [](TestHooks& h, const char* v) { h.socket_bind_gate = v; }},
    {"ADP_TEST_SOCKET_REFUSE_CHMOD", HookSide::kGateway, "1: the Unix socket's chmod fails (EPERM) without being made",
     [](TestHooks& h, const char* v) { h.socket_refuse_chmod = std::string_view(v) == "1"; }},
    {"ADP_TEST_ACCEPT_THREAD_FAIL", HookSide::kGateway,
     "system: the start of the gateway's accept thread fails with std::system_error (EAGAIN); alloc: with "
     "std::bad_alloc",
     [](TestHooks& h, const char* v) { h.accept_thread_fail = v; }},
    {"ADP_TEST_STORE_READER_FAIL", HookSide::kGateway,
     "post: a connection's store reader cannot be made (std::bad_alloc): its stores take the buffer path; job: "
     "each job posted to it throws std::bad_alloc before it reads: that store fails with the reason; read: its "
     "reads of client memory throw std::bad_alloc holding the client's lease (the same answer, the lease given back)",
     [](TestHooks& h, const char* v) { h.store_reader_fail = v; }},
    {"ADP_TEST_LOADAVG_FILE", HookSide::kBoth,
     "--request-spin-us and reply_spin_us read the runnable threads from this file, not /proc/loadavg",
     [](TestHooks& h, const char* v) { h.loadavg_file = v; }},
    {"ADP_TEST_SPIN_LOAD_EVERY_MS", HookSide::kBoth,
     "--request-spin-us and reply_spin_us read the runnable threads again once this long has passed (10)",
     [](TestHooks& h, const char* v) { h.spin_load_every_ms = std::atoi(v); }},
    {"ADP_TEST_CPU_MAX_FILE", HookSide::kBoth,
     "the CPUs counted (piece helpers, --request-spin-us, reply_spin_us) take their quota from this cpu.max file",
     [](TestHooks& h, const char* v) { h.cpu_max_file = v; }},
    {"ADP_TEST_CARD_FAILING_HOLD_MS", HookSide::kBoth,
     "a card reads failing until an I/O succeeds this long after its last error (10000)",
     [](TestHooks& h, const char* v) { h.card_failing_hold_ms = std::atoi(v); }},
    {"ADP_TEST_DELIVERY_DELAY_MS", HookSide::kConnector, "a pause in each delivery of a load's bytes",
     [](TestHooks& h, const char* v) { h.delivery_delay_ms = std::atoi(v); }},
    {"ADP_TEST_PUT_COPY_DELAY_MS", HookSide::kConnector, "a pause in each put round's copy into the ring",
     [](TestHooks& h, const char* v) { h.put_copy_delay_ms = std::atoi(v); }},
    {"ADP_TEST_STALL_LOG_INTERVAL_MS", HookSide::kConnector,
     "a gateway stall's WARNING is logged at most once per this long (60000)",
     [](TestHooks& h, const char* v) { h.stall_log_interval_ms = std::atoi(v); }},
    {"ADP_TEST_STALL_CHECK_MS", HookSide::kConnector,
     "a request's wait for its reply looks at the gateway's stall this often (250)",
     [](TestHooks& h, const char* v) { h.stall_check_ms = std::atoi(v); }},
    {"ADP_TEST_YAMA_PTRACE_SCOPE", HookSide::kConnector, "stands in for /proc/sys/kernel/yama/ptrace_scope",
     [](TestHooks& h, const char* v) { h.yama_ptrace_scope = std::atoi(v); }},
    {"ADP_TEST_CLIENT_CPUS", HookSide::kConnector, "reply_spin_us's load rule counts this many CPUs, not the machine's",
     [](TestHooks& h, const char* v) { h.client_cpus = std::atoi(v); }},
    {"ADP_TEST_IDLE_CHECK_MS", HookSide::kConnector,
     "a connection is looked at for the gateway's close before a batch only after this long with nothing heard (100)",
     [](TestHooks& h, const char* v) { h.idle_check_ms = std::atoi(v); }},
    {"ADP_TEST_MAX_BACKOFF_MS", HookSide::kConnector,
     "the longest wait between connects to a gateway that is away, and a refused token's, is this long, not 2000 ms",
     [](TestHooks& h, const char* v) { h.max_backoff_ms = std::atoi(v); }},
    {"ADP_TEST_NO_PROCMAP_QUERY", HookSide::kConnector,
     "1: the connector answers as on a kernel without PROCMAP_QUERY (before 6.11): segments found by reading "
     "/proc/self/maps whole, a load's mapping proved by a nonce, stores not from segments (process memory where "
     "granted, else the ring)",
     [](TestHooks& h, const char* v) { h.no_procmap_query = std::string_view(v) == "1"; }},
    {"ADP_TEST_NO_PEER_PIDFD", HookSide::kConnector,
     "1: the connector answers as on a kernel without SO_PEERPIDFD (before 6.5): the gateway's pidfd from pidfd_open "
     "of its pid, and where that pid is not visible (another PID namespace) no segments nor process memory",
     [](TestHooks& h, const char* v) { h.no_peer_pidfd = std::string_view(v) == "1"; }},
    {"ADP_TEST_IDLE_LOOK_MS", HookSide::kConnector,
     "an idle connector looks at its connections for the gateway's close (a status query if all are) this often, "
     "not every 1000 ms",
     [](TestHooks& h, const char* v) { h.idle_look_ms = std::atoi(v); }},
};

constexpr std::string_view kPrefix = "ADP_TEST_";

bool known_hook(std::string_view name) {
  for (const Hook& k : kHooks)
    if (name == k.name) return true;
  return false;
}

}  // namespace

TestHooks read_test_hooks() {
  TestHooks h;
  for (const Hook& k : kHooks) {
    const char* v = std::getenv(k.name);
    if (!v) continue;
    k.take(h, v);
    h.set.push_back({k.name, v, k.side, k.what});
  }
  // An ADP_TEST_ name no hook has (misspelt, or a hook removed: the connect timeout's, in session 30) did
  // nothing and said nothing, so a test that set it passed or failed for another reason than the one it meant.
  for (char** e = environ; e && *e; e++) {
    const std::string_view var(*e);
    const std::string_view name = var.substr(0, var.find('='));
    if (name.substr(0, kPrefix.size()) == kPrefix && !known_hook(name)) h.unknown.emplace_back(name);
  }
  return h;
}

void warn_test_hooks(const TestHooks& hooks, HookSide side) {
  const char* who = side == HookSide::kGateway ? "gateway" : "connector";
  for (const TestHooks::Set& s : hooks.set)
    if (s.side == side || s.side == HookSide::kBoth)
      ADP_WARN("%s: test hook %s=%s is set (%s): this process is not for production", who, s.name.c_str(),
               log_safe(s.value).c_str(), s.what);
  if (hooks.unknown.empty()) return;  // (the set below made only where needed: no allocation otherwise)
  // Once per process and name: a test process builds many connectors in the same environment.
  // Never destroyed: a connector may be built while the process exits.
  static std::mutex mu;
  static auto* warned = new std::set<std::string>;
  for (const std::string& name : hooks.unknown) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (!warned->insert(name).second) continue;
    }
    ADP_WARN(
        "%s: %s is set but is not a known test hook: it does nothing (misspelt, or a hook removed? the hooks: "
        "docs/testing.md)",
        who, log_safe(name).c_str());
  }
}

std::vector<std::string> known_test_hooks() {
  std::vector<std::string> names;
  for (const Hook& k : kHooks) names.emplace_back(k.name);
  return names;
}

void apply_failing_hold(const TestHooks& hooks) {
  failing_hold_ms().store(hooks.card_failing_hold_ms >= 0 ? hooks.card_failing_hold_ms : kFailingHold.count(),
                          std::memory_order_relaxed);
}

}  // namespace adp
