// SPDX-License-Identifier: Apache-2.0
// Sockets of the gateway protocol: endpoints (unix:// and tcp://), connect
// and listen, and whole-frame send/receive with deadlines. Every wait is a
// poll() bounded by a deadline; a socket shut down by another thread
// (stop/interrupt) ends the wait at once as kClosed.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/frame.h"
#include "util/status.h"

namespace adp::proto {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
constexpr Deadline kNoDeadline = Deadline::max();
// The pace a frame's rest must keep (session 31): once its first byte came (read_frame) or went (write_frame
// with kFramePace), the byte after its first `done` bytes is due by that moment + kFrameTimeout +
// done / kFrameMinBytesPerSecond (frame_pace_by); a peer behind that line is cut, the frame incomplete.
//
// Why a line and not a fixed time: until session 31 the whole rest had to come within kFrameTimeout. Over TCP (a
// gateway served to LMCache servers on other hosts) a 32 MiB object at 2.5 MB/s, a 20 Mbit/s share of a busy link,
// takes 13 s: its put or its load failed and the connection was dropped though the peer was alive and sending.
// The limit is there against a peer that stalls or trickles (slowloris: a byte now and then holds a connection's
// thread), and the line keeps that: a peer that stops after its first byte is cut after kFrameTimeout (plus its
// bytes so far at the rate: it is cut no later than 10 s + 1 s per MiB it sent), a trickling one as soon as it
// falls behind, and a frame's whole transfer is bounded by kFrameTimeout + its size at the rate (the largest a TCP
// connection takes, kMaxTableBytes + 64 MiB, about 78 s; a Hello, 4 KiB, within the handshake timeout anyway).
// The line bounds a frame, not a connection: it starts again at each frame's first byte, and between frames the
// gateway waits for a next frame's first byte until --idle-timeout-s (600 s by default). So it does not make
// holding a thread dear: a token holder keeps a connection's thread with one small frame per idle period (a
// 24-byte Stats, sent whole or trickled over about 10 s): the 64 TCP client threads for 64 such frames (1.5 KiB)
// per 10 min, or about 150 B/s to keep all 64 inside trickled frames. What bounds that is --max-tcp-clients and
// the token, not the pace (review32 D1; the 10 s per frame before session 31 had the same shape).
// No bound on each gap between bytes: TCP over a busy link delivers in bursts (a retransmission's timeout backs
// off to seconds), and a peer ahead of the line earned the time it waits; the line bounds the waits anyway.
//
// 1 MiB/s (8 Mbit/s): a floor, not a speed; a live link slower than that on average fails only frames larger than
// what kFrameTimeout covers (at 512 KiB/s, frames over 10 MiB), and a load from a cache at under 1 MiB/s is slower
// than most recomputes. Not an option: see docs/protocol.md ("Timing of a frame").
constexpr std::chrono::milliseconds kFrameTimeout{10000};
constexpr uint64_t kFrameMinBytesPerSecond = 1ull << 20;
// When the byte after the first `done` of a frame that began at `first` is due (the line above).
Deadline frame_pace_by(Deadline first, uint64_t done);
// As write_frame's deadline: the frame's pace alone (the gateway's replies); a caller's own deadline (a client's
// batch deadline) is kept as given, without the pace: that deadline wins.
constexpr Deadline kFramePace = Deadline::min();

struct Endpoint {
  enum class Kind { kUnix, kTcp } kind = Kind::kUnix;
  std::string path;  // unix
  std::string host;  // tcp
  uint16_t port = 0;
  std::string str() const;
};

// "unix:///abs/path.sock" or "tcp://host:port" (port 0 allowed to listen on
// an ephemeral port).
Status parse_endpoint(std::string_view url, Endpoint* out);

// Lets another thread end a connect in progress at once (connect_endpoint and
// whatever its caller then waits for on the socket, a handshake): it shuts the
// socket down (shutdown(2)), which ends every wait on it (kClosed, or the
// connect's own error). watch(fd): the socket exists, before connect(2); false
// when the watcher gave up already (the socket is closed, kClosed). cancelled():
// asked once connect(2) was made, so a cancel between watch() and connect(2),
// which shutdown(2) of a socket not yet connecting may miss, still ends it.
// unwatch(fd): before the socket is closed or handed on, so a late cancel never
// shuts down a reused descriptor.
class ConnectWatch {
 public:
  virtual ~ConnectWatch() = default;
  virtual bool watch(int fd) = 0;
  virtual bool cancelled() = 0;
  virtual void unwatch(int fd) = 0;
};

// With `watch`, the socket is watched from its creation: on failure it is
// unwatched before it is closed; on success it stays watched (the caller
// unwatches it).
Status connect_endpoint(const Endpoint& ep, Deadline deadline, int* fd, ConnectWatch* watch = nullptr);
// Test hooks for a Unix listener's start (util/test_hooks.h: ADP_TEST_SOCKET_*).
struct ListenHooks {
  std::string bind_gate;      // not empty: between bind(2) and the chmod, waits (60 s at most) for this file to exist
  bool refuse_chmod = false;  // the socket file's chmod fails (EPERM) without being made
};

// Binds and listens. Unix: a stale socket file (nobody accepting) is removed
// first; a live one or a non-socket file at the path is an error. The socket
// file is never wider than kUnixSocketMode: the socket is fchmod'ed to it
// before bind(2) (Linux creates the file with the socket's mode less the
// umask), then the file is chmod'ed to exactly that mode (a umask narrower
// than 007 undone) before listen(2); a failed fchmod or chmod is an error,
// the file removed. TCP: the bound port is written back into ep->port.
Status listen_endpoint(Endpoint* ep, int backlog, int* fd, const ListenHooks& hooks = {});

// A Unix socket file's mode: its group decides who may use the card.
constexpr unsigned kUnixSocketMode = 0660;

// A received frame. body holds exactly header.body_bytes bytes.
struct Frame {
  FrameHeader header{};
  std::vector<uint8_t> body;
  std::vector<int> fds;  // descriptors passed with the frame (Unix sockets); owned by the receiver
};

// Sends header + table + payload (iovecs) in one go. pass_fd >= 0 rides on
// the frame's first byte (SCM_RIGHTS). The deadline is checked after every
// partial send: past it the frame stays incomplete (TimedOut) and the
// connection must be dropped. kFramePace: the frame's pace from this call
// on (kFrameTimeout + its bytes sent at kFrameMinBytesPerSecond); cut by it,
// TimedOut says how far it got.
//
// moved_ns (both calls; null: none): set to the steady clock's time in ns
// (Clock) whenever the peer demonstrably moved bytes of the frame, so a
// reader of it (a connector's stall check, gateway_stall_s) sees a peer that
// is sending or taking a long frame on a slow link as alive, not only once
// the whole frame moved. read_frame: whenever bytes come. write_frame: only
// when the socket takes bytes after it was full and had to be waited on (the
// peer took some to make room); never for what it takes at once, which went
// into this host's socket buffer whether the peer runs or not (session 32,
// review32 P1: a request written whole to a stopped gateway read as the
// gateway heard from).
//
// sent (null: none): the bytes of this frame the socket took, kept up as they
// go (session 32). Above 0 after a failure (or an exception out of this
// call), the connection is inside this frame for good: nothing more may be
// written on it, an Error frame included, whose bytes would land inside the
// frame the peer is reading.
Status write_frame(int fd, FrameType type, uint64_t request_id, std::span<const uint8_t> table,
                   std::span<const iovec> payload, Deadline deadline, int pass_fd = -1,
                   std::atomic<int64_t>* moved_ns = nullptr, uint64_t* sent = nullptr);

// Receives one frame whose body is at most max_body bytes (checked before
// the body is allocated). The first byte is awaited until first_byte_by; the
// rest must keep the frame's pace (kFrameTimeout + its bytes so far at
// kFrameMinBytesPerSecond), and come by first_byte_by. Past first_byte_by:
// TimedOut; behind the pace: TimedOut saying what came and how far ("frame
// not completed: ..."), InvalidArgument where first_byte_by is kNoDeadline.
// Descriptors arriving with the frame are kept in frame->fds (at most
// max_fds; any beyond that are closed and the frame is refused).
Status read_frame(int fd, uint32_t max_body, Deadline first_byte_by, Frame* frame, size_t max_fds = 0,
                  std::atomic<int64_t>* moved_ns = nullptr);

// Waits until `by` for a next frame's first byte, or the peer's end or an error (read_frame then says which): Ok
// when there is something to read, TimedOut when `by` passed with nothing (session 32). The gateway's idle limit
// between requests (--idle-timeout-s) is this wait alone: a peer whose frame began is sending, not idle, and only
// read_frame's pace governs the rest of its frame. (Given the limit as its first_byte_by, read_frame held the
// whole frame to it: a request begun shortly before the limit was cut mid-frame, logged as idle.)
Status await_frame(int fd, Deadline by);

void close_fds(std::vector<int>* fds);

// An Error frame (the connection's last: why it is closed) with `reason`, cut to kMaxMessageBytes, sent by
// `deadline` (kNoDeadline: no bound; a deadline passed: only what the socket takes at once). Allocates nothing and
// throws nothing (session 30): the header and the body are made in a buffer of this call's own, where
// encode_error's body and write_frame's iovecs were allocated, so a connection ended or refused for want of memory
// (std::bad_alloc) was closed without its Error frame and its client saw the connection closed, not why. True when
// the whole frame went out.
bool send_error_frame(int fd, uint64_t request_id, std::string_view reason, Deadline deadline) noexcept;

// Refuses a connection just accepted, on the accept thread (no wait): an Error frame with the reason (printf's
// `fmt`), which the client reads in place of HelloOk (the Hello's id is 1), our side ended (FIN), what the peer sent
// already (its Hello) read, so that closing with unread input does not reset the connection before the frame is
// read, and the descriptor closed. Allocates nothing and throws nothing (session 30): the text is made in a buffer of
// its own and the frame by send_error_frame, so a connection refused for want of memory gets its Error frame where
// memory stays out (until session 29 the text and the frame's body were std::string and std::vector: with no memory
// for them the connection was closed without the frame, and its client saw a closed socket, not why). A reason over
// kMaxMessageBytes is cut between UTF-8 characters, as every text of the protocol (utf34).
__attribute__((format(printf, 2, 3))) void refuse_at_accept(int fd, const char* fmt, ...) noexcept;

// Ends our side (FIN) and discards what the peer still sends for a moment
// (bounded in time and bytes), so closing with unread input does not reset
// the connection and lose the Error frame just sent. Allocates nothing (the
// path of an Error frame sent for want of memory).
void finish_sending(int fd) noexcept;

}  // namespace adp::proto
