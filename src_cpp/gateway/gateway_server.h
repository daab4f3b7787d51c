// SPDX-License-Identifier: Apache-2.0
// GatewayServer: the daemon's core. Owns one card store, a fixed pool of
// IoContexts over it, and listeners on a Unix socket (payload through
// shared-memory rings) and optionally TCP (payload inline, token required).
// Each client connection is served by a thread of its own (ClientHandler).
//
// Threading: Start() returns with an accept thread running. stop() may be
// called from any thread (not from a signal handler); it shuts every socket
// down, lets batches in progress finish, joins the clients, closes the card
// (sealing open regions) and removes the socket file. wait() tells when that
// is done.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gateway/client_handler.h"
#include "gateway/io_context_pool.h"
#include "protocol/socket_io.h"
#include "store/card_store.h"

namespace adp {

// The upper bounds of GatewayServer::Start's ranges (kGatewayOptionRanges below: the CLI's too).
constexpr int kMaxIoContexts = 64;
constexpr int kMaxProcessWriteThreads = 1024;
constexpr int kMaxPipelinedStores = 64;
constexpr int kMaxRequestSpinUs = 10000;

struct GatewayOptions {
  CardOptions card;
  std::string socket_path;  // Unix socket; required
  std::string tcp_listen;   // "tcp://host:port" (port 0: any free port) or empty
  std::string token;        // required with tcp_listen
  int io_contexts = 4;      // store operations in parallel, 1 to kMaxIoContexts
  // Helper threads that write the pieces of process loads (r5) beside the
  // connections' threads where CPUs are spare (PiecePool); -1: as many as
  // the CPUs the gateway may use (PiecePool::usable_cpus: sched_getaffinity,
  // or its cgroup's CPU quota where fewer), 0: none; at most kMaxProcessWriteThreads.
  int process_write_threads = -1;
  // Pipelined process stores at once (review r8 S4: each may hold an I/O
  // context and a frontier place for up to its bound); -1: half the I/O
  // contexts, rounded down (none with one context); 0: no pipelined stores;
  // at most kMaxPipelinedStores.
  int max_pipelined_stores = -1;
  // After answering a put or get, a connection's thread looks for the
  // client's next request this long before it sleeps in poll() (a sleeping
  // thread's wake-up is what a request's round trip is mostly made of on a
  // VM: benchmarks/README.md, "Session eleven"); only while every connection
  // leaves a CPU spare beside its own and its client's (connections x 2 <=
  // CPUs) and the machine runs at most CPUs / 2 threads (/proc/loadavg).
  // 0 (the default): never. The 16-core run with 100 cut ~8 of the ~75 us of
  // round trip a 2 MiB request (benchmarks/README.md, "Session eleven").
  // At most kMaxRequestSpinUs.
  int request_spin_us = 0;
  // Populate each registered segment's written pages in the gateway's page
  // tables in the background (proto::SegmentPrefaulter), so the first load
  // into a page does not (~220 us a 2 MiB object on the 2-CPU VM). Costs
  // page tables (~2 MiB a GiB of segment) and one thread's CPU while it runs
  // (~110 ms a GiB on the 2-CPU VM). false: loads populate their own pages.
  bool segment_prefault = true;
  // Limits (README, "Gateway limits"). Unauthenticated TCP peers have their
  // own small pool and a short handshake timeout, so they never hold the
  // slots of local (Unix) or authenticated clients.
  int max_clients = 256;                        // local (Unix) connections
  int max_tcp_clients = 64;                     // authenticated TCP connections
  int max_handshakes = 16;                      // TCP connections not yet authenticated
  int handshake_timeout_ms = 2000;              // Hello must arrive within this
  int idle_timeout_ms = 600000;                 // a connection with no request begun this long is closed
  uint64_t max_ring_bytes = 1ull << 30;         // one connection's ring
  uint64_t max_ring_total_bytes = 32ull << 30;  // the rings of all connections together
  // r5 stores: one connection's buffer for objects read from its client's
  // process memory before the card store takes them (ConnectionLimits).
  uint64_t max_store_buffer_bytes = 256ull << 20;
  uint64_t max_store_buffer_total_bytes = 4ull << 30;  // the store buffers of all connections together
  uint32_t max_request_timeout_ms = 3600000;           // a batch's timeout_ms at most (larger: clamped)
  // The client segments mapped, together (review33b F2): each is a mapping of its file's whole size (up to 1 TiB),
  // address space of which the gateway has 128 TiB for everything it maps; a registration past it is refused for
  // now (protocol r19: the client sends that file's buffers through the ring and registers it again later).
  uint64_t max_segment_total_bytes = 32ull << 40;
};

// The options Start refuses outside a range of their own (InvalidArgument, before the card is opened), one row each:
// Start checks them from here, the bindings export the ranges (_native.GATEWAY_OPTION_RANGES) and `lmcache-adp
// gateway` (lmcache_adp/gateway.py) builds its checks and --help from that, so that a bound changed here moves all
// three (py35: the CLI kept its own copies of 64, 1024, 10000 beside these).
struct GatewayOptionRange {
  const char* name;  // the GatewayOptions field, and GatewayServer's keyword in Python
  const char* flag;  // `lmcache-adp gateway`'s
  int min, max;
  int GatewayOptions::* field;
};
inline constexpr GatewayOptionRange kGatewayOptionRanges[] = {
    {"io_contexts", "--io-contexts", 1, kMaxIoContexts, &GatewayOptions::io_contexts},
    {"process_write_threads", "--process-write-threads", -1, kMaxProcessWriteThreads,
     &GatewayOptions::process_write_threads},
    {"max_pipelined_stores", "--max-pipelined-stores", -1, kMaxPipelinedStores, &GatewayOptions::max_pipelined_stores},
    {"request_spin_us", "--request-spin-us", 0, kMaxRequestSpinUs, &GatewayOptions::request_spin_us},
};

class GatewayServer {
 public:
  static Status Start(const GatewayOptions& opts, std::unique_ptr<GatewayServer>* out);
  ~GatewayServer();
  GatewayServer(const GatewayServer&) = delete;
  GatewayServer& operator=(const GatewayServer&) = delete;

  void stop();
  // True once stopped and the card is closed; waits at most `timeout`.
  bool wait(std::chrono::milliseconds timeout);
  uint16_t tcp_port() const { return tcp_ep_.port; }
  StoreStats stats() const;
  // Connections past the handshake as clients, or in it; status queries (r10) not counted (r11), nor connections
  // ended.
  size_t clients() const;
  // The counters of a StatsReply (store, clients, batches, rings) as JSON.
  std::string stats_json() const;

 private:
  struct Client {
    uint64_t id;
    int fd;
    bool tcp;
    std::thread thread;
    std::atomic<bool> done{false};
    std::shared_ptr<ConnectionControl> control;  // shared with its ClientHandler
  };

  // The connections not ended (ConnectionControl::phase), local only or all: clients, status queries within their
  // transport's limit and on its reserve, and those in their handshake (not yet known as either: review N9), apart.
  // Under mu_.
  struct Open {
    size_t clients = 0, status_queries = 0, reserve_queries = 0, handshakes = 0;
    size_t hung_up = 0;  // of the status queries on the reserve and handshakes (without_hung_up only)
    // What the local bound counts (r16: a status query within --max-clients apart, kStatusQueryReserve).
    size_t bounded() const { return clients + reserve_queries + handshakes - hung_up; }
    // ", N more in their handshake" for the log lines that count them, or nothing where none is. In a buffer of its
    // own, no allocation: the stopping line is made on the accept thread, where a std::bad_alloc ended the gateway
    // (std::terminate, its card left as a crash leaves it: session 29).
    struct Text {
      char text[48] = "";
      const char* c_str() const { return text; }
    };
    Text handshakes_text() const {
      Text t;
      if (handshakes) std::snprintf(t.text, sizeof t.text, ", %zu more in their handshake", handshakes);
      return t;
    }
  };
  // without_hung_up: not counting the local status queries on the reserve and connections in their handshake whose
  // client hung up (POLLHUP; one poll): their threads are about to end (a status query asks only for Stats), so a full
  // gateway does not count them at accept: `lmcache-adp status` returned, its connection closed, holds no slot.
  Open open_connections(bool local_only, bool without_hung_up = false) const;

  GatewayServer() = default;
  void accept_loop();
  // Accepts one connection of listen_fd; 0, or the errno of an accept4 that left the connection in the backlog
  // (EMFILE, ENFILE, ENOBUFS, ENOMEM: out of descriptors or memory), after which accept_paused is called.
  int accept_one(int listen_fd, bool tcp);
  // Stops polling the listening sockets for accept_backoff_ (kAcceptFirstBackoff doubling to kAcceptMaxBackoff
  // while the failures go on), counts it (accept_backoffs) and logs the episode's first (WARNING, the limit named).
  void accept_paused(int err);
  // Starts c's thread; throws std::system_error where none can be started (accept_one refuses c then).
  void start_connection(Client& c);
  void reap(bool all);
  // The INFO count line of the clients that hung up before their HelloOk (each at DEBUG: audit 13 item 7): one for
  // a burst, gathered kGoneGather from the first, and at most one every kGoneLineEvery; at_once: whatever is
  // counted, now (stopping). Returns how long the accept loop may wait before calling it again (ms; -1: no
  // line due).
  int log_gone_clients(bool at_once);
  void shutdown_store();
  void wake();

  GatewayOptions opts_;
  proto::Endpoint unix_ep_, tcp_ep_;
  int unix_fd_ = -1, tcp_fd_ = -1, wake_fd_ = -1;
  // The socket file this gateway bound (device, inode): removed at its end only while the path still names it,
  // not one a gateway started since in its place made there.
  dev_t socket_dev_ = 0;
  ino_t socket_ino_ = 0;
  std::unique_ptr<CardStore> store_;
  std::unique_ptr<IoContextPool> pool_;
  std::shared_ptr<GatewayShared> shared_;  // also held by each connection's thread
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;
  std::condition_variable stopped_cv_;
  bool stopped_ = false;
  std::list<Client> clients_;
  uint64_t next_client_ = 1;
  StoreStats final_stats_;
  // log_gone_clients' (the accept thread's only): those of shared_->gone_before_hello_ok in a line already, when
  // the first of those not yet was seen, when their line is due, and when the last line went.
  uint64_t gone_logged_ = 0;
  proto::Clock::time_point gone_first_{}, gone_due_{}, gone_last_line_{};
  // accept_paused's (the accept thread's only): when the listening sockets are polled again, the pause's length,
  // and when the episode's first failure was (its WARNING logged; {} while accepts go through).
  static constexpr std::chrono::milliseconds kAcceptFirstBackoff{100}, kAcceptMaxBackoff{1000};
  proto::Clock::time_point accept_resume_{}, accept_paused_since_{};
  std::chrono::milliseconds accept_backoff_{0};
};

}  // namespace adp
