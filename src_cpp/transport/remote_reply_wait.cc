// SPDX-License-Identifier: Apache-2.0
// A worker's request sent and its reply waited for and read
// (RemoteSession::send_request, read_reply): the wait that looks at the
// gateway's stall (wait_reply), reply_spin_us's spin (spin_for_reply,
// expect), and r4's wait for the gateway's next piece (wait_for_ticket).
// Not here: what a round sends and does with the reply (remote_session.cc).
#include <linux/futex.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "transport/remote_session.h"
#include "util/log.h"

namespace adp {
namespace {

// r4: how long a client waiting for the gateway's next piece spins before
// it sleeps on the ticket, and the longest sleep (then it looks at the
// socket: a gateway that died never bumps the ticket).
constexpr std::chrono::microseconds kPieceSpin{10};
constexpr std::chrono::microseconds kPieceSleep{1000};

// reply_spin_us (RemoteSession::spin_for_reply): a worker's spin for a reply
// starts this long (or a 32nd of the round trip it expects, if more) before
// that round trip, so that its sleep's own wake-up (a timer's: as slow as the
// socket's on an idle CPU, and late by a 1000th of the sleep at most) lands
// before the reply; the timer slack its sleeps then have.
constexpr std::chrono::microseconds kReplySpinLead{50};
constexpr unsigned long kReplySpinTimerSlackNs = 1000;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

Status RemoteSession::send_request(const proto::BatchRequest& req, std::span<const iovec> payload, Deadline deadline) {
  const auto sending = Clock::now();
  Status s = client_->send(req, payload, deadline);
  if (s.ok()) times.sent(sending);
  sent_op_ = -1;
  spin_armed_ = false;
  if (s.ok() && (req.op == proto::Op::kPut || req.op == proto::Op::kGet)) {
    sent_op_ = req.op == proto::Op::kPut ? 0 : 1;
    spin_armed_ = true;
    sent_at_ = sending;
    sent_bytes_ = 0;
    for (const auto& it : req.items) sent_bytes_ += it.size;
  }
  return s;
}

Status RemoteSession::read_reply(const proto::BatchRequest& req, Deadline deadline, proto::BatchReply* reply,
                                 bool* alive) {
  wait_reply(deadline);
  Status s = client_->await_reply(req, deadline, reply, alive);
  if (s.ok() && !(alive && *alive)) {
    const auto now = Clock::now();
    times.replied(now);
    expect(now);
  }
  if (s.ok()) backend_->note_answered();
  return s;
}

void RemoteSession::wait_reply(Deadline deadline) {
  if (spin_armed_) {
    spin_armed_ = false;
    if (spin_for_reply(deadline)) return;
  }
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline || client_->wait_readable(std::min<Deadline>(deadline, now + backend_->stall_check_))) return;
    backend_->check_stall();
  }
}

bool RemoteSession::spin_for_reply(Deadline deadline) {
  const auto spin = backend_->opts_.reply_spin;
  if (spin.count() <= 0 || sent_op_ < 0) return false;
  const Expected& e = expected_[sent_op_];
  if (e.bytes != sent_bytes_ || e.low_ns <= 0) return false;
  const auto from = sent_at_ + std::chrono::nanoseconds(e.low_ns) -
                    std::max<std::chrono::nanoseconds>(kReplySpinLead, std::chrono::nanoseconds(e.low_ns / 32));
  // A request expected to take longer than a stall check: the spin would gain it little, and the sleep
  // before it would skip a look at the stall.
  if (from - Clock::now() > backend_->stall_check_) return false;
  SpinRecord& record = spin_record_[sent_op_];
  if (!record.due()) return false;
  if (!backend_->reply_load_.allows(backend_->connections_.load(std::memory_order_relaxed),
                                    backend_->reply_spinning_.load(std::memory_order_relaxed)))
    return false;
  if (!slack_set_) {  // the sleep to `from` wakes within a microsecond (50 us otherwise)
    slack_set_ = true;
    ::prctl(PR_SET_TIMERSLACK, kReplySpinTimerSlackNs, 0, 0, 0);
  }
  // The reply (or a hang-up) there before the spin's start: no spin (review r13 N2: counted as one).
  if (client_->sleep_readable(std::min<Deadline>(from, deadline))) return true;
  if (Clock::now() >= deadline) return false;
  backend_->reply_spinning_.fetch_add(1, std::memory_order_relaxed);
  const short ev = client_->spin_readable(std::min<Deadline>(from + spin, deadline));
  backend_->reply_spinning_.fetch_sub(1, std::memory_order_relaxed);
  const bool hit = ev & POLLIN;
  times.reply_spins++;
  if (hit) times.reply_spin_hits++;
  record.note(hit);
  return ev != 0;
}

void RemoteSession::expect(Clock::time_point replied) {
  if (sent_op_ < 0) return;
  Expected& e = expected_[sent_op_];
  const int64_t took = std::chrono::duration_cast<std::chrono::nanoseconds>(replied - sent_at_).count();
  if (e.bytes != sent_bytes_ || e.low_ns <= 0) {
    e.bytes = sent_bytes_;
    e.low_ns = took;
  } else {
    e.low_ns = took < e.low_ns ? took : e.low_ns + (took - e.low_ns) / 8;
  }
  sent_op_ = -1;
}

void RemoteSession::wait_for_ticket(uint32_t seen, Deadline deadline) {
  uint32_t* ticket = reinterpret_cast<uint32_t*>(client_->ring()->data() + proto::kProgressTicketAt);
  uint32_t* waiting = reinterpret_cast<uint32_t*>(client_->ring()->data() + proto::kProgressWaitingAt);
  // The next piece is often a copy's time away: spin that long first.
  const auto spin_until = Clock::now() + kPieceSpin;
  do {
    for (int i = 0; i < 32; i++) {
      if (__atomic_load_n(ticket, __ATOMIC_ACQUIRE) != seen) return;
      cpu_relax();
    }
  } while (Clock::now() < spin_until);
  auto left = std::min<Clock::duration>(deadline - Clock::now(), kPieceSleep);
  if (left <= Clock::duration::zero()) return;
  // Sequentially consistent against the gateway's bump-then-look: either it
  // sees us waiting and wakes us, or we see its bump and do not sleep.
  __atomic_store_n(waiting, 1u, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(ticket, __ATOMIC_SEQ_CST) == seen) {
    timespec ts{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(left).count())};
    ::syscall(SYS_futex, ticket, FUTEX_WAIT, seen, &ts, nullptr, 0);  // shared memory: not FUTEX_PRIVATE
  }
  __atomic_store_n(waiting, 0u, __ATOMIC_RELAXED);
}

}  // namespace adp
