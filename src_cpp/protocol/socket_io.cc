// SPDX-License-Identifier: Apache-2.0
#include "protocol/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "util/clip.h"
#include "util/log.h"

namespace adp::proto {
namespace {

int poll_ms(Deadline deadline) {
  if (deadline == kNoDeadline) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left + 1, 0, 60000));  // re-checked after each wake
}

// Waits until fd is ready for `events`; Ok, TimedOut or Closed.
Status wait_ready(int fd, short events, Deadline deadline) {
  for (;;) {
    if (deadline != kNoDeadline && Clock::now() >= deadline) return Status::TimedOut("gateway did not answer in time");
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, poll_ms(deadline));
    if (r < 0 && errno != EINTR) return Status::IoError("poll: " + errno_text(errno));
    if (r > 0) {
      // An error with bytes still to read (a peer that wrote its reason and
      // closed at once): the read that follows gets the bytes first.
      if ((p.revents & POLLNVAL) || ((p.revents & POLLERR) && !(p.revents & POLLIN & events)))
        return Status::Closed("connection closed");
      return Status::Ok();  // readable, writable or hung up: the next call tells which
    }
  }
}

const char* frame_type_name(uint8_t type) {
  static constexpr const char* kNames[] = {
      "unknown",    "Hello",           "HelloOk",   "Batch",           "BatchReply", "Error", "Stats",
      "StatsReply", "RegisterSegment", "SegmentOk", "RegisterProcess", "ProcessOk",  "Alive"};
  return type < std::size(kNames) ? kNames[type] : kNames[0];
}

void note_moved(std::atomic<int64_t>* moved_ns) {
  if (moved_ns)
    moved_ns->store(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(),
                    std::memory_order_relaxed);
}

std::string seconds_since(Deadline start) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(Clock::now() - start).count());
  return text;
}

// The pace's rule as a peer cut by it is told (and the log says: log_safe keeps 200 bytes of a reason, so the
// whole text stays under that with the largest numbers).
static_assert(kFrameTimeout == std::chrono::seconds(10) && kFrameMinBytesPerSecond == (1u << 20), "pace_rule's text");
std::string pace_rule(const char* peer) {
  return std::string("(a frame's rest is due within 10 s + 1 s/MiB: ") + peer + ")";
}

Status sockaddr_of(const Endpoint& ep, sockaddr_storage* sa, socklen_t* len) {
  std::memset(sa, 0, sizeof *sa);
  if (ep.kind == Endpoint::Kind::kUnix) {
    auto* un = reinterpret_cast<sockaddr_un*>(sa);
    if (ep.path.empty() || ep.path.size() >= sizeof un->sun_path)
      return Status::InvalidArgument("socket path must be 1 to " + std::to_string(sizeof un->sun_path - 1) +
                                     " bytes: " + ep.path);
    un->sun_family = AF_UNIX;
    std::memcpy(un->sun_path, ep.path.data(), ep.path.size());
    *len = sizeof(sockaddr_un);
    return Status::Ok();
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(ep.host.c_str(), std::to_string(ep.port).c_str(), &hints, &res);
  if (rc != 0 || !res) return Status::Unavailable("cannot resolve " + ep.host + ": " + gai_strerror(rc));
  std::memcpy(sa, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return Status::Ok();
}

int new_socket(const sockaddr_storage& sa) { return ::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0); }

void tune_tcp(int fd, const sockaddr_storage& sa) {
  if (sa.ss_family == AF_UNIX) return;
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // one request in flight: no Nagle wait
}

// Removes a Unix socket file nobody accepts on; refuses a live one.
Status clear_stale_socket(const Endpoint& ep) {
  struct stat st;
  if (::lstat(ep.path.c_str(), &st) != 0) return Status::Ok();
  if (!S_ISSOCK(st.st_mode)) return Status::InvalidArgument(ep.path + " exists and is not a socket; not replacing it");
  int fd = -1;
  Status s = connect_endpoint(ep, Clock::now() + std::chrono::seconds(2), &fd);
  if (s.ok() || s.code() == Status::Code::kBusy) {  // kBusy: listening, its accept queue full
    if (s.ok()) ::close(fd);
    return Status::Busy("a gateway is already listening on " + ep.path);
  }
  if (::unlink(ep.path.c_str()) != 0 && errno != ENOENT)
    return Status::IoError("cannot remove stale socket " + ep.path + ": " + errno_text(errno));
  ADP_INFO("gateway: removed stale socket %s", ep.path.c_str());
  return Status::Ok();
}

}  // namespace

Deadline frame_pace_by(Deadline first, uint64_t done) {
  return first + kFrameTimeout + std::chrono::microseconds(done * 1000000ull / kFrameMinBytesPerSecond);
}

std::string Endpoint::str() const {
  if (kind == Kind::kUnix) return "unix://" + path;
  bool v6 = host.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Status parse_endpoint(std::string_view url, Endpoint* out) {
  constexpr std::string_view kUnix = "unix://", kTcp = "tcp://";
  if (url.starts_with(kUnix)) {
    out->kind = Endpoint::Kind::kUnix;
    out->path = std::string(url.substr(kUnix.size()));
    if (out->path.empty() || out->path[0] != '/')
      return Status::InvalidArgument("'" + std::string(url) +
                                     "': a unix endpoint needs an absolute path, as unix:///run/x.sock");
    return Status::Ok();
  }
  if (!url.starts_with(kTcp))
    return Status::InvalidArgument("'" + std::string(url) + "' is not unix:///path or tcp://host:port");
  std::string_view rest = url.substr(kTcp.size());
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    return Status::InvalidArgument("'" + std::string(url) + "': expected tcp://host:port");
  std::string_view host = rest.substr(0, colon), port = rest.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned value = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || p != port.data() + port.size() || port.empty() || value > 65535)
    return Status::InvalidArgument("'" + std::string(url) + "': port must be 0-65535");
  out->kind = Endpoint::Kind::kTcp;
  out->host = std::string(host);
  out->port = static_cast<uint16_t>(value);
  return Status::Ok();
}

Status connect_endpoint(const Endpoint& ep, Deadline deadline, int* fd, ConnectWatch* watch) {
  sockaddr_storage sa;
  socklen_t len;
  Status s = sockaddr_of(ep, &sa, &len);
  if (!s.ok()) return s;
  int f = new_socket(sa);
  if (f < 0) return Status::IoError("socket: " + errno_text(errno));
  const auto abandoned = [&ep] { return Status::Closed("connect to " + ep.str() + " abandoned"); };
  if (watch && !watch->watch(f)) {
    ::close(f);
    return abandoned();
  }
  const auto fail = [&](Status why) {
    if (watch) watch->unwatch(f);
    ::close(f);
    return why;
  };
  ::fcntl(f, F_SETFL, ::fcntl(f, F_GETFL) | O_NONBLOCK);
  int err = 0;
  if (::connect(f, reinterpret_cast<sockaddr*>(&sa), len) != 0) err = errno;
  if (watch && watch->cancelled()) return fail(abandoned());
  // A Unix socket whose listener's accept queue is full refuses at once (EAGAIN) and stays unconnected: polled, it
  // reads writable with no error, and the first send failed "Transport endpoint is not connected". Busy: a live
  // listener (clear_stale_socket keeps its socket file).
  if (err == EAGAIN && sa.ss_family == AF_UNIX)
    return fail(Status::Busy("cannot connect to " + ep.str() +
                             ": its accept queue is full (the gateway is not accepting connections: stopped, hung "
                             "or overloaded)"));
  if (err == EINPROGRESS) {
    s = wait_ready(f, POLLOUT, deadline);
    socklen_t el = sizeof err;
    if (s.ok() && ::getsockopt(f, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    if (watch && watch->cancelled()) return fail(abandoned());
    if (!s.ok()) return fail(s);
  }
  if (err != 0) return fail(Status::Unavailable("cannot connect to " + ep.str() + ": " + errno_text(err)));
  tune_tcp(f, sa);
  *fd = f;
  return Status::Ok();
}

Status listen_endpoint(Endpoint* ep, int backlog, int* fd, const ListenHooks& hooks) {
  if (ep->kind == Endpoint::Kind::kUnix) {
    Status s = clear_stale_socket(*ep);
    if (!s.ok()) return s;
  }
  sockaddr_storage sa;
  socklen_t len;
  Status s = sockaddr_of(*ep, &sa, &len);
  if (!s.ok()) return s;
  int f = new_socket(sa);
  if (f < 0) return Status::IoError("socket: " + errno_text(errno));
  const bool unix_socket = sa.ss_family == AF_UNIX;
  const auto fail = [&](const std::string& what, int err, bool bound) {
    ::close(f);
    if (bound && unix_socket) ::unlink(ep->path.c_str());  // the file this call made: nothing left behind
    return Status::IoError(what + ep->str() + ": " + errno_text(err));
  };
  int one = 1;
  if (!unix_socket) ::setsockopt(f, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Not umask(2): process-wide, and an embedded gateway shares its process with LMCache's threads.
  if (unix_socket && ::fchmod(f, kUnixSocketMode) != 0)
    return fail("cannot set the mode of the socket for ", errno, false);
  if (::bind(f, reinterpret_cast<sockaddr*>(&sa), len) != 0) return fail("cannot listen on ", errno, false);
  if (unix_socket) {
    for (int i = 0; !hooks.bind_gate.empty() && i < 6000 && ::access(hooks.bind_gate.c_str(), F_OK) != 0; ++i)
      ::usleep(10000);
    int rc = hooks.refuse_chmod ? (errno = EPERM, -1) : ::chmod(ep->path.c_str(), kUnixSocketMode);
    if (rc != 0) return fail("cannot make the socket group-only (chmod 0660) on ", errno, true);
  }
  if (::listen(f, backlog) != 0) return fail("cannot listen on ", errno, true);
  if (!unix_socket) {
    sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    ::getsockname(f, reinterpret_cast<sockaddr*>(&bound), &bl);
    ep->port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  ::fcntl(f, F_SETFL, ::fcntl(f, F_GETFL) | O_NONBLOCK);
  *fd = f;
  return Status::Ok();
}

Status write_frame(int fd, FrameType type, uint64_t request_id, std::span<const uint8_t> table,
                   std::span<const iovec> payload, Deadline deadline, int pass_fd, std::atomic<int64_t>* moved_ns,
                   uint64_t* sent_out) {
  size_t body = table.size();
  for (const iovec& v : payload) body += v.iov_len;
  FrameHeader h = make_header(type, request_id, body);
  std::vector<iovec> iov;
  iov.reserve(2 + payload.size());
  iov.push_back({&h, sizeof h});
  if (!table.empty()) iov.push_back({const_cast<uint8_t*>(table.data()), table.size()});
  for (const iovec& v : payload)
    if (v.iov_len) iov.push_back(v);

  // kFramePace: the gateway's replies keep the frame's pace from here (kFrameTimeout + the bytes sent so far at
  // kFrameMinBytesPerSecond), a client that stopped reading or reads too slowly is cut behind it.
  const bool paced = deadline == kFramePace;
  const Deadline start = Clock::now();
  const uint64_t total = sizeof h + body;
  uint64_t sent = 0;
  if (sent_out) *sent_out = 0;
  const auto due = [&] { return paced ? frame_pace_by(start, sent) : deadline; };
  const auto cut = [&] {
    if (!paced) return Status::TimedOut("deadline passed while sending");
    return Status::TimedOut("frame not taken: " + std::to_string(sent) + " of " + std::to_string(total) +
                            " bytes of a " + frame_type_name(static_cast<uint8_t>(type)) + " frame (request " +
                            std::to_string(request_id) + ") in " + seconds_since(start) + " " +
                            pace_rule("peer not reading or too slow"));
  };

  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  size_t next = 0;
  // moved_ns: only bytes the socket takes after it had to be waited on (session 32, review32 P1). What sendmsg
  // takes at once went into this host's socket buffer: nothing on the peer's side had to run, so a request frame
  // written whole to a stopped gateway read as the gateway heard from, and (the connector's stall check takes the
  // latest over its connections) one worker's new request hid another's wait on a stopped gateway. Room that came
  // back after the socket was full was made by the peer taking bytes (a Unix socket's: the peer read them; TCP:
  // the peer's host acked them into its receive buffer, which a stopped peer fills within that buffer at the
  // link's rate), so a long frame on a slow link still counts as it goes.
  bool waited = false;
  while (next < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + next;
    msg.msg_iovlen = std::min<size_t>(iov.size() - next, IOV_MAX);
    if (pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        Status s = wait_ready(fd, POLLOUT, due());
        if (!s.ok()) return paced && s.code() == Status::Code::kTimedOut ? cut() : s;
        waited = true;
        continue;
      }
      return Status::Closed("send failed: " + errno_text(errno));
    }
    pass_fd = -1;  // delivered with the first byte
    sent += static_cast<uint64_t>(n);
    if (sent_out) *sent_out = sent;
    if (waited) note_moved(moved_ns);
    waited = false;
    size_t done = static_cast<size_t>(n);
    while (next < iov.size() && done >= iov[next].iov_len) done -= iov[next++].iov_len;
    if (next < iov.size()) {
      iov[next].iov_base = static_cast<uint8_t*>(iov[next].iov_base) + done;
      iov[next].iov_len -= done;
      // Checked after every send, not only when the socket is full: a frame
      // cut short here is refused by the peer as truncated, never acted on.
      if (deadline != kNoDeadline && Clock::now() >= due()) return cut();
    }
  }
  return Status::Ok();
}

namespace {

// The bytes of a frame received so far, and when its first came: the pace its rest keeps (frame_pace_by).
struct Pace {
  Deadline first = kNoDeadline;  // none yet: the first byte is awaited until the caller's deadline alone
  uint64_t done = 0;
  std::atomic<int64_t>* moved_ns = nullptr;  // read_frame's
};

// Receives exactly n bytes, collecting passed descriptors into *fds. An end
// of stream before a frame's first byte is an orderly close; inside a frame
// it is a truncated frame. Waits until `deadline`, and once the frame's first
// byte came (pace->first) no longer than its pace allows: TimedOut either way
// (read_frame tells which).
Status recv_exact(int fd, uint8_t* buf, size_t n, Deadline deadline, std::vector<int>* fds, bool frame_start,
                  Pace* pace) {
  size_t got = 0;
  while (got < n) {
    iovec v{buf + got, n - got};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &v;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t r = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        const Deadline by =
            pace->first == kNoDeadline ? deadline : std::min(deadline, frame_pace_by(pace->first, pace->done));
        Status s = wait_ready(fd, POLLIN, by);
        if (!s.ok()) return s;
        continue;
      }
      return Status::Closed("receive failed: " + errno_text(errno));
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; i++) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(passed);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) return Status::InvalidArgument("too many descriptors passed with a frame");
    if (r == 0)
      return frame_start && got == 0 ? Status::Closed("connection closed")
                                     : Status::InvalidArgument("truncated frame: connection closed inside it");
    got += static_cast<size_t>(r);
    pace->done += static_cast<uint64_t>(r);
    if (pace->first == kNoDeadline) pace->first = Clock::now();
    note_moved(pace->moved_ns);
  }
  return Status::Ok();
}

}  // namespace

Status read_frame(int fd, uint32_t max_body, Deadline first_byte_by, Frame* frame, size_t max_fds,
                  std::atomic<int64_t>* moved_ns) {
  frame->fds.clear();
  auto* hdr = reinterpret_cast<uint8_t*>(&frame->header);
  Pace pace;
  pace.moved_ns = moved_ns;
  Status s = recv_exact(fd, hdr, 1, first_byte_by, &frame->fds, true, &pace);
  if (s.ok()) s = recv_exact(fd, hdr + 1, kFrameHeaderBytes - 1, first_byte_by, &frame->fds, false, &pace);
  if (s.ok()) s = check_header(frame->header, max_body);
  if (s.ok()) {
    frame->body.resize(frame->header.body_bytes);
    s = recv_exact(fd, frame->body.data(), frame->body.size(), first_byte_by, &frame->fds, false, &pace);
  }
  if (s.ok() && frame->fds.size() > max_fds) s = Status::InvalidArgument("unexpected descriptors passed with a frame");
  if (!s.ok()) close_fds(&frame->fds);
  // Behind the pace, not past the caller's deadline: a peer too slow or stalled (slowloris), told what came. Still
  // TimedOut for a caller with a deadline, as the fixed 10 s was (a connector's read of a reply: a timeout, not an
  // outage; the gateway refuses it as a bad frame: ClientHandler::serve).
  if (s.code() == Status::Code::kTimedOut && pace.first != kNoDeadline && Clock::now() < first_byte_by) {
    const std::string what =
        pace.done < kFrameHeaderBytes
            ? std::to_string(pace.done) + " of the " + std::to_string(kFrameHeaderBytes) + " bytes of a frame header"
            : std::to_string(pace.done) + " of " + std::to_string(kFrameHeaderBytes + frame->header.body_bytes) +
                  " bytes of a " + frame_type_name(frame->header.type) + " frame (request " +
                  std::to_string(frame->header.request_id) + ")";
    std::string why = "frame not completed: " + what + " in " + seconds_since(pace.first) + " " +
                      pace_rule("peer stalled or too slow");
    return first_byte_by == kNoDeadline ? Status::InvalidArgument(why) : Status::TimedOut(why);
  }
  return s;
}

Status await_frame(int fd, Deadline by) {
  for (;;) {  // polled once even with `by` passed: a byte already there is a frame begun, as read_frame reads it
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, poll_ms(by));
    if (r > 0) return Status::Ok();  // a byte, the end or an error: read_frame tells which
    if (r < 0 && errno != EINTR) return Status::IoError("poll: " + errno_text(errno));
    if (r == 0 && by != kNoDeadline && Clock::now() >= by) return Status::TimedOut("no frame began in time");
  }
}

void close_fds(std::vector<int>* fds) {
  for (int f : *fds) ::close(f);
  fds->clear();
}

namespace {
// Whether fd has `events` (or an error or hang-up) before `deadline`; wait_ready without its Status (whose text
// allocates).
bool ready_by(int fd, short events, Deadline deadline) noexcept {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, poll_ms(deadline));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
    if (r == 0 && deadline != kNoDeadline && Clock::now() >= deadline) return false;
  }
}
}  // namespace

bool send_error_frame(int fd, uint64_t request_id, std::string_view reason, Deadline deadline) noexcept {
  reason = clip_utf8(reason, kMaxMessageBytes);  // between UTF-8 characters, as encode_error (utf34)
  // The frame encode_error and write_frame make: header, u16 length, the text.
  uint8_t frame[kFrameHeaderBytes + 2 + kMaxMessageBytes];
  const FrameHeader h = make_header(FrameType::kError, request_id, 2 + reason.size());
  std::memcpy(frame, &h, sizeof h);
  const auto n = static_cast<uint16_t>(reason.size());
  std::memcpy(frame + sizeof h, &n, sizeof n);
  std::memcpy(frame + sizeof h + 2, reason.data(), reason.size());
  const size_t size = sizeof h + 2 + reason.size();
  for (size_t sent = 0; sent < size;) {
    const ssize_t w = ::send(fd, frame + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      sent += static_cast<size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && errno == EAGAIN) {
      if ((deadline != kNoDeadline && Clock::now() >= deadline) || !ready_by(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

void refuse_at_accept(int fd, const char* fmt, ...) noexcept {
  // One byte past the bound: send_error_frame's clip_utf8 must see the byte after it to tell whether the bound cuts
  // a character. In a buffer of kMaxMessageBytes + 1 (until py35) vsnprintf cut the text at the bound itself, so a
  // character across it went out cut in half, its lead byte last (pybind11's strict decode raises on it).
  char reason[kMaxMessageBytes + 2];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  if (n < 0) reason[0] = '\0';
  send_error_frame(fd, 1, reason, Clock::now());
  ::shutdown(fd, SHUT_WR);
  uint8_t sink[4096];
  for (int i = 0; i < 4 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
  }
  ::close(fd);
}

void finish_sending(int fd) noexcept {
  ::shutdown(fd, SHUT_WR);
  Deadline until = Clock::now() + std::chrono::milliseconds(200);
  uint8_t sink[16384];
  for (size_t total = 0; total < (1u << 20);) {
    if (!ready_by(fd, POLLIN, until)) return;
    ssize_t r = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return;
    if (r > 0) total += static_cast<size_t>(r);
  }
}

}  // namespace adp::proto
