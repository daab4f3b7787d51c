// SPDX-License-Identifier: Apache-2.0
// What ClientHandler's own files share (client_handler.cc, process_load.cc,
// process_store.cc) and nothing else includes: whether this thread is inside
// the card gate, the transfer of a client's memory
// (ClientHandler::in_client_memory), the store reader, and the piece size of
// a process store's reads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "gateway/client_handler.h"

namespace adp {

// Whether this thread is inside shared->gate (CardGate): a connection's
// thread is for its batch, a piece for its card part; both leave it for
// every wait on the client (except a pipelined store's wait for its reader's
// next piece, bounded by its card place's hold) and come back only while the
// gate is open.
inline thread_local bool t_in_card = false;

inline bool card_enter(CardGate& gate) {
  if (!t_in_card) t_in_card = gate.enter();
  return t_in_card;
}

inline void card_leave(CardGate& gate) {
  if (t_in_card) gate.leave();
  t_in_card = false;
}

// Inside the gate for a scope (already inside: stays so after it).
class CardSection {
 public:
  explicit CardSection(CardGate& gate) : gate_(gate), outer_(t_in_card), ok_(card_enter(gate)) {}
  ~CardSection() {
    if (!outer_) card_leave(gate_);
  }
  CardSection(const CardSection&) = delete;
  CardSection& operator=(const CardSection&) = delete;
  explicit operator bool() const { return ok_; }

 private:
  CardGate& gate_;
  const bool outer_, ok_;
};

// Adds `n` to `count` for a scope, taken back however it is left (an exception included).
template <class T>
class CountedWhile {
 public:
  CountedWhile(std::atomic<T>& count, T n) : count_(count), n_(n) { count_ += n_; }
  ~CountedWhile() { count_ -= n_; }
  CountedWhile(const CountedWhile&) = delete;
  CountedWhile& operator=(const CountedWhile&) = delete;

 private:
  std::atomic<T>& count_;
  const T n_;
};

inline unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }

// r5 stores: the client's memory is read in pieces of this size, each under
// the lease, the client's liveness checked before each.
inline constexpr size_t kProcessReadPieceBytes = 1u << 20;

// The connection's store reader: one job at a time (a chunk's reads), posted
// by the connection's thread, which waits for it to end before the next.
struct ClientHandler::StoreReader {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> job;
  bool pending = false;  // job posted and not yet ended
  bool quit = false;
  std::thread thread;
};

template <typename F>
Status ClientHandler::in_client_memory(F&& fn) {
  if (control_) {
    std::lock_guard<std::mutex> l(control_->mu);
    if (control_->abandoned) return Status::Closed("the gateway stopped");
    // No new transfer once stop() began: one the client stalls would hold it.
    if (control_->stopping.load(std::memory_order_relaxed)) return Status::Closed("the gateway is stopping");
    // Since the last transfer began or ended: stop() gives up only when no
    // thread of this connection got through one for that long.
    control_->in_transfer++;
    control_->transfer_since = std::chrono::steady_clock::now();
  }
  // Out of the card gate while the client may stall this thread (the card
  // can close meanwhile); back in only if it is still open.
  const bool in_card = t_in_card;
  card_leave(shared_->gate);
  Status s;
  try {
    s = fn();
  } catch (...) {  // the transfer's mark taken back (stop() would wait on it), then the connection ends with it
    if (control_) {
      std::lock_guard<std::mutex> l(control_->mu);
      control_->in_transfer--;
      control_->transfer_since = std::chrono::steady_clock::now();
    }
    throw;
  }
  if (control_) {
    std::lock_guard<std::mutex> l(control_->mu);
    control_->in_transfer--;
    control_->transfer_since = std::chrono::steady_clock::now();
    if (control_->abandoned) {
      abandoned_ = true;
      return Status::Closed("the gateway stopped while the client's memory stalled it");
    }
  }
  if (in_card && !card_enter(shared_->gate)) {
    abandoned_ = true;
    return Status::Closed("the gateway closed its card while the client's memory stalled it");
  }
  return s;
}

}  // namespace adp
