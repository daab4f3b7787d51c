// SPDX-License-Identifier: Apache-2.0
// The words of the ring's control page the gateway and the client share
// (protocol/frame.h; docs/protocol.md, "Segments", "Ring progress"): the load
// lease, and the progress slots and ticket of a get's pieces.
#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

#include "gateway/client_handler.h"

namespace adp {

using proto::Clock;

bool ClientHandler::join_lease(uint64_t request_id, proto::Deadline deadline) {
  std::unique_lock<std::mutex> lock(lease_mu_);
  // Writes join a held lease until each slot has written once; then the
  // next waits for the lease to go back to OPEN. A waiter re-takes it at
  // once, so a revoke for any reason but the deadline may lose that race
  // for the rest of the object (review r7 S4); past the request's deadline
  // nothing takes or joins it, so a revoke at the client's deadline waits
  // out at most the pieces already in flight, one per slot.
  lease_free_.wait(lock, [&] { return lease_holders_ == 0 || lease_joins_ < bounce_slots_; });
  if (Clock::now() >= deadline) return false;
  if (lease_holders_ == 0) {
    if (!take_lease(request_id)) return false;
    lease_joins_ = 0;
  }
  lease_holders_++;
  lease_joins_++;
  return true;
}

void ClientHandler::leave_lease(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(lease_mu_);
  if (--lease_holders_ == 0) {
    give_lease(request_id);
    lease_free_.notify_all();
  }
}

bool ClientHandler::take_lease(uint64_t request_id) {
  uint64_t* word = reinterpret_cast<uint64_t*>(ring_->data());
  uint64_t expected = proto::lease_word(request_id, proto::kLeaseOpen);
  return __atomic_compare_exchange_n(word, &expected, proto::lease_word(request_id, proto::kLeaseWriting), false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

void ClientHandler::give_lease(uint64_t request_id) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(ring_->data()), proto::lease_word(request_id, proto::kLeaseOpen),
                   __ATOMIC_RELEASE);
}

void ClientHandler::publish_progress(size_t item, size_t upto) {
  if (item >= proto::kProgressSlots) return;  // delivered after the reply
  auto* slot = reinterpret_cast<uint32_t*>(ring_->data() + proto::kProgressSlotsAt) + item;
  __atomic_store_n(slot, static_cast<uint32_t>(upto), __ATOMIC_RELEASE);
  bump_ticket();
  note_card_work();  // a piece read under the context: others waiting for one see the card move
}

void ClientHandler::note_waiting(uint64_t moved) {
  if (moved == waited_moved_) return;  // nothing moved: a wedged gateway goes quiet, and reads stalled
  waited_moved_ = moved;
  bump_alive();
}

void ClientHandler::bump_alive() {
  if (alive_frames_) {
    // r8 (TCP): a 24-byte frame, at most one per kAliveFrameEvery, and only
    // while the socket takes it at once: a client that does not read never
    // holds this thread (or the I/O context it may hold) on a sign of life.
    // A write that fails leaves the connection to fail at the reply (one cut part-way: send_frame() then returns
    // its cut, and nothing more goes).
    const auto now = Clock::now();
    if (now - alive_sent_at_ < proto::kAliveFrameEvery) return;
    alive_sent_at_ = now;
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT))
      (void)send_frame(proto::FrameType::kAlive, alive_request_id_, {});
    return;
  }
  // r7: a relaxed add costing nothing next to the item it follows; the
  // client reads only that it changed (frame.h, kAliveAt).
  if (!control_page()) return;
  __atomic_fetch_add(reinterpret_cast<uint32_t*>(ring_->data() + proto::kAliveAt), 1u, __ATOMIC_RELAXED);
}

void ClientHandler::bump_ticket() {
  // Sequentially consistent against the client's "waiting, then re-read the
  // ticket": either it sees the new ticket or this sees it waiting.
  auto* ticket = reinterpret_cast<uint32_t*>(ring_->data() + proto::kProgressTicketAt);
  __atomic_fetch_add(ticket, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(reinterpret_cast<uint32_t*>(ring_->data() + proto::kProgressWaitingAt), __ATOMIC_SEQ_CST))
    ::syscall(SYS_futex, ticket, FUTEX_WAKE, 1, nullptr, nullptr, 0);  // shared memory: not FUTEX_PRIVATE
}

}  // namespace adp
