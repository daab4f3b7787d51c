// SPDX-License-Identifier: Apache-2.0
// The gateway's memory budgets a connection draws on: its ring
// (--max-ring-mb, --max-ring-total-mb), its store buffer for process stores
// and the hold of its last load from a card that is not memory-speed
// (--max-store-buffer-mb, --max-store-buffer-total-mb).
#include <poll.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "gateway/client_handler.h"
#include "gateway/handler_internal.h"

namespace adp {

using proto::Clock;

Status ClientHandler::reserve_ring(uint64_t mapped) {
  const ConnectionLimits& lim = shared_->limits;
  // r12: the payload area counts (a ring_mb of N fits --max-ring-mb N); the
  // control page beside it does not. SharedRing::Attach checks the size after.
  const uint64_t bytes = proto::ring_area_bytes(mapped);
  auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  if (bytes > lim.max_ring_bytes) {
    shared_->refused++;
    return Status::InvalidArgument("a ring of " + mib(bytes) + proto::kRingTooLarge + mib(lim.max_ring_bytes) +
                                   ", --max-ring-mb)");
  }
  uint64_t cur = shared_->ring_bytes_mapped.load();
  do {
    if (cur + bytes > lim.max_ring_total_bytes) {
      shared_->refused++;
      return Status::Busy("the gateway's ring memory is used up (" + mib(cur) + " of " + mib(lim.max_ring_total_bytes) +
                          " held by other connections, --max-ring-total-mb); " + "this ring needs " + mib(bytes));
    }
  } while (!shared_->ring_bytes_mapped.compare_exchange_weak(cur, cur + bytes));
  ring_reserved_ = bytes;
  return Status::Ok();
}

uint64_t ClientHandler::store_object_limit() const {
  const ConnectionLimits& lim = shared_->limits;
  return std::min(lim.max_store_buffer_bytes, lim.max_store_buffer_total_bytes) & ~uint64_t(4095);
}

void ClientHandler::release_store_buffer() {
  const uint64_t held = store_buf_.capacity();
  if (!held) return;
  {
    AlignedBuffer gone;
    store_buf_.swap(gone);
  }  // unmapped here
  shared_->store_buffer_bytes.fetch_sub(held);
  shared_->buffer_progress.fetch_add(1, std::memory_order_relaxed);  // room given back: its waiters see it move
  std::lock_guard<std::mutex> l(shared_->store_buffer_mu);
  shared_->store_buffer_freed.notify_all();
}

void ClientHandler::settle_hold(bool release) {
  if (release || hold_over_ || hold_.capacity() > store_object_limit()) {
    AlignedBuffer gone;
    hold_.swap(gone);
  }  // unmapped here
  hold_over_ = false;
  count_hold();
}

Status ClientHandler::reserve_hold(uint64_t bytes) {
  bytes = (bytes + 4095) & ~uint64_t(4095);
  if (bytes <= hold_counted_) return Status::Ok();
  const uint64_t total = shared_->limits.max_store_buffer_total_bytes;
  const uint64_t more = bytes - hold_counted_;
  uint64_t cur = shared_->load_hold_bytes.load();
  do {
    if (cur + more > total) {
      shared_->load_hold_busy.fetch_add(1, std::memory_order_relaxed);
      auto mib = [](uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; };
      return Status::Busy("the gateway's load buffers are used up (" + mib(cur) + " of " + mib(total) +
                          " held by connections' last loads from a card that is not memory-speed, "
                          "--max-store-buffer-total-mb); this load needs " +
                          mib(more) + " more");
    }
  } while (!shared_->load_hold_bytes.compare_exchange_weak(cur, cur + more));
  hold_counted_ = bytes;
  return Status::Ok();
}

void ClientHandler::count_hold() {
  // What is mapped is what counts: a context's staging may be larger than
  // the bytes reserved. Past the total (or a store buffer's size), it is
  // given back after the batch.
  const uint64_t now = hold_.capacity();
  uint64_t sum = shared_->load_hold_bytes.load();
  if (now > hold_counted_) sum = shared_->load_hold_bytes.fetch_add(now - hold_counted_) + (now - hold_counted_);
  if (now < hold_counted_) sum = shared_->load_hold_bytes.fetch_sub(hold_counted_ - now) - (hold_counted_ - now);
  hold_counted_ = now;
  // Only a connection that holds something gives it back (review r8: a
  // release of its own re-armed the flag, dropping its next hold).
  if (now > 0 && (sum > shared_->limits.max_store_buffer_total_bytes || now > store_object_limit())) hold_over_ = true;
}

Status ClientHandler::grow_store_buffer(uint64_t need, proto::Deadline deadline) {
  const uint64_t total = shared_->limits.max_store_buffer_total_bytes;
  // Exactly the chunk's size in whole MiB, never past the limit (no doubling).
  const uint64_t bytes =
      std::max(need, std::min((need + (1u << 20) - 1) & ~uint64_t((1u << 20) - 1), store_object_limit()));
  release_store_buffer();  // its contents need not survive, and its bytes count for the new one
  auto mib = [](uint64_t b) { return std::to_string(b >> 20) + " MiB"; };
  uint64_t cur = shared_->store_buffer_bytes.load();
  waited_moved_ = buffer_moved();
  for (;;) {
    if (cur + bytes <= total) {
      if (shared_->store_buffer_bytes.compare_exchange_weak(cur, cur + bytes)) break;
      continue;
    }
    // Waits for room while the client still waits (its deadline) and the
    // connection is not closing (the client gone, or the gateway stopping).
    pollfd p{fd_, POLLRDHUP, 0};
    const auto now = Clock::now();
    if (now >= deadline || (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))) {
      shared_->store_buffer_busy.fetch_add(1, std::memory_order_relaxed);
      return Status::Busy("the gateway's store buffers are used up (" + mib(cur) + " of " + mib(total) +
                          " held by other connections, --max-store-buffer-total-mb); this chunk needs " + mib(bytes));
    }
    note_waiting(buffer_moved());  // waiting behind other connections' working stores is not stalled (r7, r10 R3)
    {
      std::unique_lock<std::mutex> l(shared_->store_buffer_mu);
      CountedWhile<uint32_t> waiting(shared_->store_buffer_waiters, 1);
      shared_->store_buffer_freed.wait_for(l, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(20)));
    }
    cur = shared_->store_buffer_bytes.load();
  }
  if (!store_buf_.reserve_exact(bytes)) {
    shared_->store_buffer_bytes.fetch_sub(bytes);
    std::lock_guard<std::mutex> l(shared_->store_buffer_mu);
    shared_->store_buffer_freed.notify_all();
    return Status::IoError("out of memory for the store buffer of " + mib(bytes), Status::IoClass::kGatewayMemory);
  }
  // What is mapped is what counts (release_store_buffer gives back the capacity).
  if (store_buf_.capacity() > bytes) shared_->store_buffer_bytes.fetch_add(store_buf_.capacity() - bytes);
  return Status::Ok();
}

}  // namespace adp
