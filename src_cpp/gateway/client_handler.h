// SPDX-License-Identifier: Apache-2.0
// ClientHandler: the gateway's side of one client connection, run on a
// thread of its own (no GIL anywhere). Handshake first (version, features,
// token on TCP, ring fd on Unix sockets), then one batch at a time: decode,
// run against the card store with a leased IoContext, reply. Any protocol
// violation ends this connection only, with an Error frame and a logged
// reason. stop: the server shuts the socket down; run() then returns once
// the batch in progress (if any) has finished.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "gateway/io_context_pool.h"
#include "protocol/client_segment.h"
#include "protocol/messages.h"
#include "protocol/process_memory.h"
#include "protocol/shared_ring.h"
#include "protocol/socket_io.h"
#include "store/card_store.h"
#include "util/idle_cpus.h"
#include "util/piece_pool.h"
#include "util/test_hooks.h"

namespace adp {

// Connections admitted past the client limit of their transport, for status
// queries only, so a full gateway still answers `lmcache-adp status
// --gateway`. A status query is within the limit while the clients and the
// status queries within it are fewer than the limit (--max-clients, local;
// --max-tcp-clients, TCP), taken at its Hello (ClientHandler::handshake), and
// is then served until --idle-timeout-s; past it, it is on its transport's
// reserve: closed once its first Stats is answered, or after
// --handshake-timeout-ms without one (TCP r15, local r16), so no peer holds
// the reserve. TCP: the reserve counted apart from --max-tcp-clients (r16;
// GatewayShared::tcp_reserve_queries). Local (r11): every local connection
// but the status queries within the limit (clients, status queries on the
// reserve, those in their handshake) within --max-clients plus the reserve,
// at accept (GatewayServer::accept_one); the status queries within the limit
// are bounded by it at their Hello (GatewayShared::local_queries).
constexpr int kStatusQueryReserve = 2;

// The limits a connection is held to (GatewayOptions).
struct ConnectionLimits {
  // Local clients past their Hello (status queries not counted), taken at the Hello (GatewayShared::local_clients).
  int max_clients = 256;
  int max_tcp_clients = 64;
  int handshake_timeout_ms = 2000;
  int idle_timeout_ms = 600000;
  uint64_t max_ring_bytes = 1ull << 30;
  uint64_t max_ring_total_bytes = 32ull << 30;
  // r5 stores: a connection's buffer for the objects it reads from the
  // client's process memory before their card space is reserved (it grows
  // to the largest chunk of them seen; a larger object is refused).
  uint64_t max_store_buffer_bytes = 256ull << 20;
  // The store buffers of all connections together (review r7 S2): a
  // buffer's growth waits for room until its chunk's deadline, then the
  // chunk's process items fail Busy.
  uint64_t max_store_buffer_total_bytes = 4ull << 30;
  // A batch's deadline (its timeout_ms, counted from arrival) at most: a
  // larger one is clamped to it, with a rate-limited warning (review r7 S4).
  uint32_t max_request_timeout_ms = 3600000;
};

// One connection's standing with the server that stops: whether its thread
// is inside a transfer of the client's memory (process_vm_readv/writev, which
// a client can stall with no time limit) and since when, and whether the
// server gave up on it (stop() then returns without it; the thread, once the
// transfer ends, touches nothing of the server: no card, no I/O context).
struct ConnectionControl {
  std::mutex mu;
  int in_transfer = 0;  // threads in one now (a process load's pieces may be on several)
  std::chrono::steady_clock::time_point transfer_since;
  bool abandoned = false;
  bool done = false;  // the thread has finished with the server's state
  // stop() began (review r7 S1): the batch in progress ends before its next
  // item, chunk or transfer of the client's memory (its reply could not be
  // sent anyway: the socket is shut down), so stop() waits for one piece or
  // item per connection, not for the rest of a batch.
  std::atomic<bool> stopping{false};
  // Where the connection is, for the accept thread's count (GatewayServer::open_connections): in its handshake (not
  // yet known to be a client or a status query: review N9, counted apart from both), past it as a client or a
  // status query (r10; apart: r11), or ended. kEnded is set by the connection's thread in its teardown, once its ring,
  // segments, store buffer and process memory are given back, right before `clients` drops: from there the accept
  // thread no longer counts it, although its thread has not ended yet (`done`), so a client admitted once
  // `clients` says there is room is admitted (and finds the ring budget given back).
  // A status query within its transport's limit is kStatusQuery, one on the reserve kReserveQuery (r16: a local
  // one within --max-clients is not counted at accept, kStatusQueryReserve).
  enum class Phase : uint8_t { kHandshake, kClient, kStatusQuery, kReserveQuery, kEnded };
  std::atomic<Phase> phase{Phase::kHandshake};
};

// The card gate (review r7 B1): every call into the CardStore or the
// IoContextPool made by a connection's thread or a piece helper is made
// inside it, and none is let in once the gateway closes its card. A thread
// leaves the gate for every wait on a client (a transfer of its memory, the
// load lease, helpers stalled in one), so what is inside is only card work
// (microseconds, or a card read) and the close waits for it to drain:
// only then are the store and the pool freed. A thread that stop() left
// behind comes back to a closed gate and ends its request (Closed).
class CardGate {
 public:
  // False once closing: the caller must not touch the card or the pool.
  bool enter() {
    inside_.fetch_add(1, std::memory_order_seq_cst);
    if (!closing_.load(std::memory_order_seq_cst)) return true;
    inside_.fetch_sub(1, std::memory_order_seq_cst);
    return false;
  }
  void leave() { inside_.fetch_sub(1, std::memory_order_seq_cst); }
  // Refuses every later enter(), then waits until nobody is inside.
  void close() {
    closing_.store(true, std::memory_order_seq_cst);
    while (inside_.load(std::memory_order_seq_cst) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool closing() const { return closing_.load(std::memory_order_seq_cst); }

 private:
  std::atomic<int> inside_{0};
  std::atomic<bool> closing_{false};
};

// What every connection of one gateway shares.
struct GatewayShared {
  CardStore* store;
  IoContextPool* pool;
  std::string token;        // required from TCP clients
  std::string description;  // sent in HelloOk
  ConnectionLimits limits;
  std::atomic<uint32_t> tcp_handshakes{0};  // TCP connections not yet past the handshake
  // Authenticated TCP connections within --max-tcp-clients: clients, and status queries within it.
  std::atomic<uint32_t> tcp_clients{0};
  // TCP status queries on the reserve (kStatusQueryReserve at most; r16: apart from tcp_clients, so one on the reserve
  // never takes a client's slot, as one counted there did once a client left).
  std::atomic<uint32_t> tcp_reserve_queries{0};
  // Local connections admitted as clients at their Hello, within limits.max_clients (a status query takes none);
  // given back in the teardown, where `clients` drops.
  std::atomic<uint32_t> local_clients{0};
  // Local status queries within --max-clients (r16): admitted at the Hello while these and local_clients are fewer
  // than it (one past is on the reserve); not counted against clients, nor at accept.
  std::atomic<uint32_t> local_queries{0};
  std::atomic<uint64_t> refused{0};  // connections refused by a limit (refused_connections)
  // Pauses of the accept thread after an accept failed for want of descriptors or kernel memory (the connection
  // left in the listen backlog; GatewayServer::accept_paused).
  std::atomic<uint64_t> accept_backoffs{0};
  // GatewayOptions::max_segment_total_bytes (--max-segment-total-gb), for ClientSegment::Attach.
  uint64_t max_segment_total_bytes = UINT64_MAX;
  // Status queries refused at their Hello for being full (--max-tcp-clients): idle connectors' probes, one a
  // second each, and `status --gateway tcp://`; not in `refused`, whose alert is for clients turned away.
  std::atomic<uint64_t> refused_status_queries{0};
  // Clients that hung up before their HelloOk reached them (each logged at DEBUG; the accept thread logs a count
  // line: GatewayServer::log_gone_clients).
  std::atomic<uint64_t> gone_before_hello_ok{0};
  // Connections ended by an exception on their thread (std::bad_alloc, say: session 25), each logged at ERROR with
  // its peer and reason; the gateway goes on serving the others (failed_connections).
  std::atomic<uint64_t> failed_connections{0};
  // Process stores a connection's store reader failed by throwing (post_read: reader_failure), session 26.
  std::atomic<uint64_t> store_reader_failures{0};
  std::atomic<uint64_t> batches{0};
  // Keys asked by lookups (exists), found / not found on the card (StoreStats::lookup_hits / lookup_misses).
  std::atomic<uint64_t> lookup_hits{0}, lookup_misses{0};
  // Put and get batches served, and the nanoseconds each connection's thread
  // spent on them, from the request read to its reply ready to send (counted
  // then, so a client that has the reply finds it counted): a client's time
  // per request beyond this is the round trip (sockets, wake-ups).
  std::atomic<uint64_t> batch_puts{0}, batch_put_ns{0}, batch_gets{0}, batch_get_ns{0};
  std::atomic<uint32_t> clients{0};             // connections past the handshake, status queries not counted
  std::atomic<uint64_t> status_queries{0};      // status queries (r10) that asked for the stats, since start
  std::atomic<uint64_t> status_probes{0};       // status queries that ended asking nothing (idle connectors' probes)
  std::atomic<uint64_t> ring_bytes_mapped{0};   // rings of the connected clients
  std::atomic<uint64_t> ring_bytes_in_use{0};   // payload bytes of batches in progress in those rings
  std::atomic<uint32_t> segments{0};            // client segments mapped (r3)
  std::atomic<uint64_t> segment_loads{0};       // objects read straight into a client segment
  std::atomic<uint64_t> segment_populates{0};   // MADV_POPULATE_WRITE calls on segment pages not populated before
  std::atomic<uint64_t> segment_stores{0};      // objects stored straight from a client segment
  std::atomic<uint64_t> ring_piece_loads{0};    // objects loaded into a ring in published pieces (r4)
  std::atomic<uint32_t> processes{0};           // connections granted process memory (r5)
  std::atomic<uint64_t> process_loads{0};       // objects written straight into a client's process memory (r5)
  std::atomic<uint64_t> process_stores{0};      // objects stored straight from a client's process memory (r5)
  std::atomic<uint64_t> process_read_bytes{0};  // bytes read from clients' process memory for stores (r5)
  std::atomic<uint64_t> process_refusals{0};    // process registrations refused (r5)
  // Process stores, phase by phase (session eight, issue 10 item 2): the
  // connection threads' wall time in the reads of chunks from the clients'
  // memory into their store buffers (helpers' pieces included: the thread
  // waits for them), and in CardStore::put of those chunks (the copy into
  // the card with its CRC, the frontier's order, the sync); two clock reads
  // a chunk.
  std::atomic<uint64_t> process_store_read_ns{0};
  std::atomic<uint64_t> process_store_put_ns{0};
  // Process stores of one large object read and stored at once (session
  // eight): objects stored so, and those whose read stalled past
  // kPipelinePieceWaitMs (their card place abandoned, then stored from the
  // buffer once read, as any other).
  std::atomic<uint64_t> process_store_pipelined{0};
  std::atomic<uint64_t> process_store_stalls{0};
  // Process stores put object by object as the store reader read each of a
  // chunk of several (session ten, ClientHandler::store_chunk_overlapped).
  std::atomic<uint64_t> process_store_overlapped{0};
  // Large process stores that went through the buffer: the connections
  // storing and loading left no CPU for a store reader beside each
  // (PiecePool::spare_cpu() false), or no pipeline slot was free once the
  // first piece was read (max_pipelined_stores).
  std::atomic<uint64_t> process_store_unpipelined_busy{0};
  // Pipelined stores in progress, and their cap (review r8 S4): each may hold
  // an I/O context and a frontier place for up to its bound, so at most half
  // the I/O contexts (by default; none with one) go to them however many
  // connections a client opens; a store over the cap (taken once its first
  // piece is read) goes through the buffer (counted as
  // process_store_unpipelined_busy).
  std::atomic<uint32_t> pipelined_stores{0};
  uint32_t max_pipelined_stores = 1;
  // GatewayOptions::request_spin_us; its load rule (util/idle_cpus.h: the
  // CPUs it counts, connections x 2 <= CPUs too; tests name another load
  // file and interval, ADP_TEST_LOADAVG_FILE, ADP_TEST_SPIN_LOAD_EVERY_MS,
  // and the quota, ADP_TEST_CPU_MAX_FILE, set once when the gateway starts).
  std::chrono::microseconds request_spin{0};
  IdleCpus spin_load;
  std::atomic<uint64_t> batch_spins{0}, batch_spin_hits{0};  // looks for a next request; those that found one
  // Store buffers (r5 stores): bytes the connections' buffers hold (within
  // limits.max_store_buffer_total_bytes), chunks failed Busy for want of
  // room; a connection that waits for room is woken when one is given back.
  std::atomic<uint64_t> store_buffer_bytes{0};
  // How the gateway moves, for the connections that wait (review r10 R3,
  // R3b). card_progress: card work done under an I/O context (a ring piece
  // read, a put chunk after store.put, a get item after store.get, a process
  // load's read, a delete item); with the pool's released(), what a wait for
  // an I/O context looks at, so work that holds no context (process-store
  // reads, items failed without I/O) cannot mask contexts hung in card I/O.
  // buffer_progress: store-buffer room given back and process-store piece
  // reads (a room holder's work before its put); with card_progress and
  // released(), what a wait for store-buffer room looks at.
  std::atomic<uint64_t> card_progress{0};
  std::atomic<uint64_t> buffer_progress{0};
  // Bytes the connections keep of their last process load from a card that
  // is not memory-speed (ClientHandler::hold_), reserved before the read
  // within limits.max_store_buffer_total_bytes (apart from the store
  // buffers' bytes) and counted again at once after it.
  std::atomic<uint64_t> load_hold_bytes{0};
  std::atomic<uint64_t> load_hold_busy{0};  // process loads failed Busy: no room for their hold
  std::atomic<uint64_t> store_buffer_busy{0};
  std::atomic<uint32_t> store_buffer_waiters{0};
  std::mutex store_buffer_mu;
  std::condition_variable store_buffer_freed;
  // Helpers for the pieces of process loads (r5); none: each connection's
  // thread writes its own. Here, not in the server: a connection thread
  // that stop() left behind in a stalled transfer may be waiting for its
  // helper, and holds this struct until it ends.
  std::unique_ptr<PiecePool> pieces;
  // The background populate of registered segments' pages
  // (GatewayOptions::segment_prefault; none when off).
  std::unique_ptr<proto::SegmentPrefaulter> segment_prefault;
  CardGate gate;  // store and pool are used only inside it (they are freed once it closed)
  // The ADP_TEST_ hooks, read once when the gateway started (util/test_hooks.h).
  TestHooks hooks;
};

// The gateway's counters as one JSON object: the body of a StatsReply.
std::string stats_json(const StoreStats& st, const GatewayShared& shared);

class ClientHandler {
 public:
  // `control` (may be null) is shared with the server's stop(); `keep` holds
  // `shared` alive for a thread the server gave up on.
  ClientHandler(int fd, bool tcp, uint64_t id, std::shared_ptr<GatewayShared> shared,
                std::shared_ptr<ConnectionControl> control = {})
      : fd_(fd),
        tcp_(tcp),
        id_(id),
        keep_(std::move(shared)),
        shared_(keep_.get()),
        control_(std::move(control)),
        handshake_counted_(tcp) {}
  // Serves the connection to its end, then gives back all it holds. Throws nothing: an exception while serving it
  // (std::bad_alloc, say) ends this connection only (logged at ERROR, counted in failed_connections), its counts
  // and registrations given back as at any end (session 25: it ended the gateway, std::terminate).
  void run() noexcept;

 private:
  // The handshake and the requests, until the connection ends (its Status).
  Status serve();
  // Gives back what the connection holds (each count once), then logs its end; throws nothing.
  void teardown(const Status& s) noexcept;
  // Notes an exception that ended serve(): counted, its reason kept in failure_ (no allocation).
  void note_failure(const std::exception& e) noexcept;
  Status handshake();
  // Takes this connection's ring (a mapping of `mapped` bytes: its payload
  // area counts, proto::ring_area_bytes) out of the gateway's ring budget.
  Status reserve_ring(uint64_t mapped);
  // After a put or get (answered_batch_): polls the socket without
  // sleeping for up to shared_->request_spin, while connections x 2 <= CPUs
  // and the machine runs at most CPUs / 2 threads (util/idle_cpus.h), so that a client with more work finds this thread
  // awake (no wake-up in its round trip). Returns early once a request (or a hang-up) is there: true then (the
  // socket seen readable, in error or hung up), so serve() reads the frame with no poll of its own.
  bool spin_for_next_request();
  Status serve_batch(const proto::Frame& frame, std::vector<uint8_t>* table, std::vector<uint8_t>* payload);
  Status serve_stats(const proto::Frame& frame);
  Status serve_register_segment(proto::Frame* frame);
  // r5: proves access to the client's memory (ProcessMemory::Attach) and
  // answers ProcessOk with the features granted, or 0 and the reason.
  Status serve_register_process(const proto::Frame& frame);
  // r5: a get item in the client's process memory, written from the card
  // piece by piece, each under the load lease.
  // r5: the reads of one put request from the client's process memory.
  struct ProcessRead {
    uint64_t request_id;
    proto::Deadline deadline;  // the request's: checked before each piece
    bool revoked = false;      // the client gave up: nothing more is read
    Status gone;               // the client process exited (or the server gave up on this connection)
  };
  // Reads the process items among items [i, end) of a put into store_buf_
  // and points their PutItems there; an item that cannot be read gets its
  // status in st and no data. False: the request ends (gone, revoked).
  // Holds nothing shared (no I/O context, no card space) while it reads,
  // in pieces on this thread and helpers of shared_->pieces, each under
  // the lease, the client's liveness checked before each: a client that
  // stalls a read stalls only this connection.
  // on_piece (may be null) is told of each piece read whole: (offset in its
  // object, length), from the thread that read it; on_object (may be null)
  // of each object read whole (its item's index, its bytes in store_buf_),
  // from the thread that read its last piece, before the call returns (an
  // object that failed is not; items and st get every object's outcome only
  // as the call returns).
  bool read_process_chunk(const proto::BatchRequest& req, size_t i, size_t end, proto::Deadline deadline,
                          ProcessRead* pr, std::vector<PutItem>* items, std::vector<Status>* st,
                          const std::function<void(size_t, size_t)>* on_piece = nullptr,
                          const std::function<void(size_t, uint8_t*)>* on_object = nullptr);
  // What store_chunk_overlapped did with a put chunk.
  enum class Overlapped {
    kNot,      // nothing done (not such a chunk, no spare CPU, no reader thread): the buffer path
    kDone,     // every item of the chunk has its status
    kRevoked,  // the client gave up the store (lease revoked): the objects not yet stored and the batch's rest
               // are not written (the first answered TimedOut here)
  };
  // Session ten (issue 10 item 2): a put chunk [i, end) of two or more
  // objects, all in process memory, on a memory-speed card, is read by this
  // connection's store reader (read_process_chunk, helpers included) while
  // this thread puts each object, or each run of them, as soon as it is
  // read whole: the read of object k + 1 beside the put of object k. No
  // card place and no I/O context is held while it waits for the reader
  // (out of the card gate): an object is put only once its bytes are all
  // in the buffer. Under the spare-CPU rule of store_pipelined. Called
  // inside the card gate, holding no I/O context. Not Ok: the connection
  // ends with it (the client process gone, or stop() gave up on this
  // connection).
  Status store_chunk_overlapped(const proto::BatchRequest& req, uint64_t request_id, size_t i, size_t end,
                                proto::Deadline deadline, std::vector<Status>* st, Overlapped* how);
  // Its reader job's own state (review r9 S1, as PipelinedRead).
  struct ChunkRead;
  // What store_pipelined did with a put chunk of one process object.
  enum class Pipelined {
    kNot,        // not pipelined (small, a card not memory-speed, no spare CPU, no reader): the buffer path
    kAnswered,   // *answer is the item's (stored, or failed)
    kReadWhole,  // stalled, or no slot was free: read whole into store_buf_ since, to be stored from there
    kRevoked,    // the client gave up the store (lease revoked): this item and the batch's rest are not written
  };
  // Session eight: one large object on a memory-speed card is read by this
  // connection's store reader while this thread, holding its card place,
  // copies each piece in as soon as it is read (from the cache). The place
  // is reserved once the first piece is read, and held only while pieces
  // keep coming: one not read within kPipelinePieceWaitMs, or the object not
  // read by then plus its bytes at kPipelineMinBytesPerSecond, abandons it
  // (a pad record: the frontier moves on, the I/O context goes back), and
  // the object is stored from the buffer once the reader has it whole
  // (kReadWhole), holding nothing shared while it waits.
  // Only while the connections storing and loading leave a CPU for the
  // reader beside each (PiecePool::spare_cpu(), the helpers' rule; with no
  // pool, always): on full CPUs the second thread cost 32 MiB x 16
  // 0.82x -> 0.74x (benchmarks/README.md, "Session eight: stores").
  // `it` is a put chunk alone, in process memory. Called inside the card
  // gate, holding no I/O context. Not Ok: the connection ends with it (the
  // client process gone, or stop() gave up on this connection).
  Status store_pipelined(const proto::BatchItem& it, uint64_t request_id, proto::Deadline deadline, Status* answer,
                         Pipelined* how);
  // A pipelined store's read: what the store reader's job reads and writes
  // (process_store.cc).
  struct PipelinedRead;
  // Session eight: runs job on this connection's store reader (a thread of
  // its own, started on first use), after the job before it has ended.
  // False: no reader thread could be started (the caller takes the buffer path).
  bool post_to_reader(std::function<void()> job);
  // Runs read(*job) on the store reader, then marks the job finished under
  // its mu and wakes its cv: the connection's thread waits for `finished`
  // before it leaves the request (review r9 S1). Job: PipelinedRead or
  // ChunkRead (each with mu, cv, finished).
  // An exception out of read (session 26: it ended the gateway) is kept in the job's `thrown` (set before
  // `finished`): the caller fails the request with it (reader_failure), the reader and the connection go on.
  // False also where the job cannot be made (no memory for it: the buffer path, as with no reader).
  template <class Job, class Read>
  bool post_read(const std::shared_ptr<Job>& job, Read read) {
    std::function<void()> run;
    try {
      const bool fail = shared_->hooks.store_reader_fail == "job";
      run = [job, read, fail]() noexcept {
        try {
          // Tests only (ADP_TEST_STORE_READER_FAIL=job): the job throws before it reads (no memory for it).
          if (fail) throw std::bad_alloc();
          read(*job);
        } catch (...) {
          job->thrown = std::current_exception();
        }
        std::lock_guard<std::mutex> l(job->mu);
        job->finished = true;
        job->cv.notify_all();
      };
    } catch (const std::exception& e) {
      note_no_reader(e);
      return false;
    }
    return post_to_reader(std::move(run));
  }
  // post_to_reader's log line when there is no reader (its thread or its job could not be made).
  void note_no_reader(const std::exception& e);
  // A reader job's exception as the status of the store(s) it ends (IoError; out of memory: of the gateway's
  // memory), logged at ERROR and counted (store_reader_failures).
  Status reader_failure(const std::exception_ptr& thrown);
  // The largest object a process store may carry: the store buffer's limit
  // (and the gateway's total for them, if lower).
  uint64_t store_object_limit() const;
  // Makes store_buf_ hold `need` bytes (whole MiB, never past the limit),
  // taken from the gateway's budget for store buffers; waits for room until
  // the deadline (or the connection closing), then Busy.
  Status grow_store_buffer(uint64_t need, proto::Deadline deadline);
  // Unmaps store_buf_ and gives its bytes back to the budget.
  void release_store_buffer();
  // After a batch: counts hold_ in shared_->load_hold_bytes, and unmaps it
  // first when `release`, when it is larger than a store buffer may be
  // (store_object_limit()), or when count_hold() found the total exceeded.
  void settle_hold(bool release);
  // Before a load from a card that is not memory-speed: reserves what
  // hold_ will take (bytes, rounded to 4 KiB) in shared_->load_hold_bytes,
  // within limits.max_store_buffer_total_bytes; Busy without room.
  Status reserve_hold(uint64_t bytes);
  // Counts hold_'s capacity in shared_->load_hold_bytes (at once after the
  // swap, not only between batches); marks it to be given back after the
  // batch when the total or a store buffer's size is exceeded.
  void count_hold();
  // Runs fn (a transfer of the client's memory) marked in control_, so that
  // stop() can give up on a transfer the client stalls; Closed if it did.
  template <typename F>
  Status in_client_memory(F&& fn);
  // Holds no IoContext and no card pin while it writes into the client
  // (CardStore::get_via_bounce): a client whose memory stalls the write
  // stalls only its own connection. An object's pieces go out on this
  // thread and on up to shared_->pieces->max_helpers() helpers at once;
  // the reply waits for every one of them.
  Status load_into_process(const proto::BatchItem& it, uint64_t request_id, proto::Deadline deadline, bool* revoked);
  Status check_request_id(const proto::Frame& frame);
  // Why the batch in progress must end now (Closed), or Ok: stop() began, or
  // gave up on this connection, or its card is closing.
  Status ended() const;
  Status run_batch(const proto::BatchRequest& req, uint64_t request_id, proto::BatchReply* reply,
                   std::vector<uint8_t>* payload);
  // The load lease in the ring's control page (frame.h): taken before an
  // object is written into a segment, given back after.
  bool take_lease(uint64_t request_id);
  void give_lease(uint64_t request_id);
  // The same lease shared by the threads writing one object's pieces into
  // process memory: the first takes it, the last gives it back.
  bool join_lease(uint64_t request_id, proto::Deadline deadline);
  void leave_lease(uint64_t request_id);
  // A joined lease, left at now() or on any way out of its scope, an exception's included (session 26: one left
  // held kept the client's revoke waiting as long as the gateway lived).
  class LeaseLeave {
   public:
    LeaseLeave(ClientHandler& h, uint64_t request_id) : h_(h), request_id_(request_id) {}
    ~LeaseLeave() { now(); }
    void now() {
      if (held_) h_.leave_lease(request_id_);
      held_ = false;
    }
    LeaseLeave(const LeaseLeave&) = delete;
    LeaseLeave& operator=(const LeaseLeave&) = delete;

   private:
    ClientHandler& h_;
    const uint64_t request_id_;
    bool held_ = true;
  };
  // r4: item `item`'s first `upto` bytes are in the ring; then the ticket.
  void publish_progress(size_t item, size_t upto);
  // Bumps the progress ticket, waking the client if it sleeps on it.
  void bump_ticket();
  // r7: bump_alive() bumps the control page's alive word (a sign of life;
  // no-op without a control page): after each put chunk, process store
  // piece, get item, ring piece, process load piece, exists or delete item.
  // r8: on a connection with no ring that asked for them, a kAlive frame
  // instead. note_card_work() also counts card work done under an I/O
  // context (GatewayShared::card_progress), note_buffer_work() a
  // process-store piece read (buffer_progress): what waiters look at.
  void bump_alive();
  void note_card_work() {
    shared_->card_progress.fetch_add(1, std::memory_order_relaxed);
    bump_alive();
  }
  void note_buffer_work() {
    shared_->buffer_progress.fetch_add(1, std::memory_order_relaxed);
    bump_alive();
  }
  // A slice of a wait: bumps the alive word only if `moved`, the measure
  // of the gateway's movement this wait looks at, changed since the wait
  // began or the last bump: a connection waiting behind others' working I/O
  // is not stalled, one behind a hung card I/O is (review r10 R3, R3b).
  void note_waiting(uint64_t moved);
  // What a wait for an I/O context looks at: contexts given back, card work
  // done under one. A wait for store-buffer room: that, room given back and
  // process-store reads.
  uint64_t card_moved() const {
    return shared_->card_progress.load(std::memory_order_relaxed) + shared_->pool->released();
  }
  uint64_t buffer_moved() const { return shared_->buffer_progress.load(std::memory_order_relaxed) + card_moved(); }
  // An I/O context from the pool by `deadline` (null: none came free),
  // bumping the alive word while it waits and contexts move.
  std::unique_ptr<IoContextPool::Lease> acquire_context(proto::Deadline deadline) {
    waited_moved_ = card_moved();
    return shared_->pool->acquire(deadline, [this] { note_waiting(card_moved()); });
  }
  uint64_t waited_moved_ = 0;  // the measure when the wait began or last bumped
  // Whether this connection's ring starts with a control page: the client's
  // rule (proto::has_control_page), so the alive word is never a payload's.
  bool control_page() const {
    return ring_ && proto::has_control_page(segments_enabled_, ring_progress_, process_offered_ != 0);
  }
  // The memory a request's offsets refer to: the ring, or the inline payload.
  Status payload_area(const proto::BatchRequest& req, uint8_t** base, uint64_t* size) const;
  // The connection's end for a rule it broke (or a frame that could not go): the WARNING and, unless a frame to the
  // client was cut part-way (torn()), the Error frame.
  void refuse(const Status& why);
  // Every frame to the client goes here, at its pace (proto::kFramePace). One cut part-way (behind its pace, a
  // failed send, or an exception out of its write) leaves the connection inside it for good: every later call
  // returns why (an Alive frame's cut, which bump_alive() goes on without, ends the batch's reply), and torn() holds.
  Status send_frame(proto::FrameType type, uint64_t request_id, std::span<const uint8_t> body,
                    std::span<const iovec> payload = {});
  // Whether a frame to the client was cut part-way (session 32): the connection then ends without an Error frame,
  // whose bytes would land inside the frame the client is reading (refuse() and log_end() sent one after the cut
  // bytes: harmless, the client had lost the frame's bounds, but a protocol never sends a frame into another).
  bool torn() const { return frame_sent_ != 0; }
  std::string peer() const;
  // peer() in `out` (cut to fit), allocating nothing: the failed connection's ERROR line (session 30).
  void peer_text(char* out, size_t size) const noexcept;
  // Whether the client hung up fully (POLLHUP or POLLERR), waiting up to wait_ms for it. Never the end of the
  // read side alone: a client that shut down only its sending side still reads its replies.
  bool hung_up(int wait_ms) const;
  // The handshake's end for a client that hung up before its HelloOk reached it.
  Status gone_before_hello_ok();
  // A connection's "connected" and "gone" lines: INFO for a client, DEBUG for a status query (r10), which an
  // operator's `lmcache-adp status` makes each time it runs.
  void log_coming_and_going(const std::string& line) const;
  // The connection's end line (teardown): its reason, at the level it calls for; a failure's Error frame to the client.
  void log_end(const Status& s);

  const int fd_;
  const bool tcp_;
  const uint64_t id_;
  std::shared_ptr<GatewayShared> keep_;
  GatewayShared* shared_;
  std::shared_ptr<ConnectionControl> control_;
  std::atomic<bool> abandoned_{false};  // stop() gave up on this connection: touch nothing of the server's
  std::unique_ptr<proto::SharedRing> ring_;
  bool segments_enabled_ = false;  // r3 negotiated
  bool segment_stores_ = false;    // r3 stores from segments granted
  bool ring_progress_ = false;     // r4: a get's pieces published in the control page
  // r8: no ring (TCP) and the client asked: bump_alive() sends a kAlive frame
  // (at most one per kAliveFrameEvery) for the batch alive_request_id_, on
  // the connection's thread (the only one that calls it without a ring).
  bool alive_frames_ = false;
  bool error_classes_ = false;  // r9: the client asked: each I/O error's class in its reply item
  bool status_query_ = false;   // r10: a status query, not a client: Stats only, logged at DEBUG, not in `clients`
  uint64_t alive_request_id_ = 0;
  std::chrono::steady_clock::time_point alive_sent_at_{};
  std::unique_ptr<proto::ClientSegment> segments_[proto::kMaxSegments];  // by id - 1
  // r5: the process-memory features offered in HelloOk (a registration may
  // then grant them), and those granted; the client's address space.
  uint32_t process_offered_ = 0;
  uint32_t process_granted_ = 0;
  bool store_limit_sent_ = false;  // r6: ProcessOk carries limits.max_store_buffer_bytes
  bool process_registered_ = false;
  std::unique_ptr<proto::ProcessMemory> process_;
  // r5 loads: a bounce buffer for each thread that may write a piece at
  // once (256 KiB each, allocated on first use) and, from a card that is
  // not memory-speed, the object read into staging.
  std::unique_ptr<AlignedBuffer[]> bounces_;
  // Counted among the connections loading from its first process load
  // until it waited 20 ms for a request (the helpers an object may
  // take: PiecePool::Caller).
  std::unique_ptr<PiecePool::Caller> loader_;
  int test_loader_idle_ms_ = 20;  // those 20 ms; tests only: ADP_TEST_LOADER_IDLE_MS (hooks, at the handshake)
  size_t bounce_slots_ = 0;
  // The object of the last such load (an I/O context's staging it traded
  // places with). Kept for the next (the context took the old one), but
  // within bounds: reserved before the read (ClientHandler::reserve_hold),
  // given back after a batch when larger than a store buffer may be or past
  // the total, after kStoreBufferIdleMs idle, and when the connection ends.
  AlignedBuffer hold_;
  uint64_t hold_counted_ = 0;  // its bytes in shared_->load_hold_bytes (reserved, or mapped)
  bool hold_over_ = false;     // past a bound: given back after the batch
  // The load lease held by the writers of one object's pieces together.
  std::mutex lease_mu_;
  std::condition_variable lease_free_;
  size_t lease_holders_ = 0, lease_joins_ = 0;
  // r5 stores: the chunk's objects read from the client before the card
  // store reserves their place (limits.max_store_buffer_bytes at most,
  // counted in shared_->store_buffer_bytes; given back after the connection
  // was idle kStoreBufferIdleMs, after a put batch while another connection
  // waits for room, and when the connection ends).
  AlignedBuffer store_buf_;
  // Session eight: a process store of one large object on a memory-speed
  // card is read into store_buf_ by this connection's store reader while
  // this thread, holding the object's card place (reserved once the first
  // piece is read), copies each piece read into the card (CRC fused) while
  // it is still in the cache; a piece not read within kPipelinePieceWaitMs,
  // or an object not read within that plus its bytes at
  // kPipelineMinBytesPerSecond, abandons the place (the object is then
  // stored from the buffer once the reader is done, as any other), and this
  // connection stores through the buffer alone for a while.
  struct StoreReader;
  std::shared_ptr<StoreReader> reader_;
  // Set when a read stalled (or no reader thread could start): the
  // connection stores through the buffer alone until pipeline_retry_ after
  // it (review r8 S5: one scheduling hiccup on a busy host must not cost a
  // well-behaved connection its pipeline for life; the cap above bounds what
  // a client gains by stalling again).
  std::optional<std::chrono::steady_clock::time_point> reader_stalled_at_;
  // 30 s (tests only: ADP_TEST_PIPELINE_RETRY_MS).
  std::chrono::steady_clock::duration pipeline_retry_ = std::chrono::seconds(30);
  // Tests only (ADP_TEST_SEGMENT_WRITE_DELAY_MS): a pause before each object
  // written into a segment, outside the lease, as a slow card would take.
  int test_segment_delay_ms_ = 0;
  // Tests only (ADP_TEST_RING_PIECE_DELAY_MS): a pause before each piece of
  // a get read into the ring in pieces (r4), as a slow card would take.
  int test_piece_delay_ms_ = 0;
  // Tests only (ADP_TEST_PROCESS_WRITE_STALL_MS): the gateway's first process
  // write past an object's first piece (one connection, once) waits this
  // long before taking the lease, counted as a transfer of the client's
  // memory (stop() leaves it behind after 2 s), as a write into a
  // client's memory that a FUSE file or userfaultfd it never serves stalls.
  int test_process_stall_ms_ = 0;
  // Tests only (ADP_TEST_PROCESS_WRITE_STALL_ON=helper): that write (and
  // the read of ADP_TEST_PROCESS_READ_STALL_MS) only on a helper of the
  // piece pool.
  bool test_process_stall_on_helper_ = false;
  // Tests only (ADP_TEST_PROCESS_READ_STALL_MS): the gateway's first process
  // read (a store's) past an object's first piece (once per gateway) waits
  // this long inside the read, under the lease, as a process_vm_readv of a
  // buffer on a FUSE file or userfaultfd range the client never serves.
  int test_process_read_stall_ms_ = 0;
  // Tests only (ADP_TEST_PROCESS_READ_STALL_AT=start): that read is an
  // object's first piece instead (a pipelined store's reader not yet ahead).
  bool test_process_read_stall_at_start_ = false;
  // Tests only (ADP_TEST_PROCESS_READ_PIECE_DELAY_MS): every piece a store
  // reader reads (pipelined stores only; not its helpers) waits this long
  // inside the read, as a client that serves each piece slowly (review r8 B2).
  int test_process_read_delay_ms_ = 0;
  uint64_t ring_reserved_ = 0;  // bytes of shared->ring_bytes_mapped this connection holds
  bool tcp_counted_ = false;    // holds one of shared->tcp_clients
  bool on_reserve_ = false;     // a status query past its transport's limit (kStatusQueryReserve): one Stats, briefly
  bool tcp_reserve_counted_ = false;  // holds one of shared->tcp_reserve_queries
  bool local_counted_ = false;        // holds one of shared->local_clients
  bool local_query_counted_ = false;  // holds one of shared->local_queries
  // Why the gateway closed a status query on the reserve (answered, or no Stats in time): its "gone" line.
  const char* reserve_closed_ = nullptr;
  bool handshake_done_ = false;
  bool handshake_counted_;        // holds one of shared->tcp_handshakes (a TCP connection, until its handshake ends)
  bool process_counted_ = false;  // holds one of shared->processes
  bool failed_ = false;           // serve() ended by an exception (note_failure)
  char failure_[200] = {};        // its reason, for the ERROR line and the client's Error frame
  bool client_counted_ = false;   // holds one of shared->clients (counted before its HelloOk went)
  bool gone_before_hello_ok_ = false;  // the client hung up before its HelloOk reached it (audit 13 item 7)
  // The "connected" line of a client whose sending side had ended when its HelloOk went out: logged with its first
  // request, or at its end unless it hung up (then it was gone before its HelloOk).
  std::string held_connected_line_;
  std::string peer_;  // peer(), read before the HelloOk goes out (a TCP socket reset in answer to it has none)
  // Bytes of the frame send_frame() is writing, kept up by write_frame as they go; 0 again once it went whole, so
  // not 0 after a frame cut part-way (torn()).
  uint64_t frame_sent_ = 0;
  Status torn_why_;  // that frame's cut, what every later send_frame() returns
  uint64_t last_request_id_ = 0;
  uint64_t served_ = 0;
  bool asked_stats_ = false;     // a Stats request came (a status query is counted in status_queries at the first)
  bool answered_batch_ = false;  // the last frame served was a put or get: look for the next request first
};

}  // namespace adp
