// SPDX-License-Identifier: Apache-2.0
// EmbeddedBackend: the gateway in-process. The connector's workers call the
// card store directly, each with an IoContext of its own.
#pragma once

#include <memory>

#include "connector/backend.h"
#include "store/card_store.h"

namespace adp {

class EmbeddedBackend : public Backend {
 public:
  explicit EmbeddedBackend(std::shared_ptr<CardStore> store) : store_(std::move(store)) {}
  std::unique_ptr<BackendSession> new_session() override;
  bool exists_now(const std::string* keys, size_t n, uint8_t* found) override {
    for (size_t i = 0; i < n; i++) found[i] = store_->exists(keys[i]);
    return true;
  }
  std::string describe() const override;
  // A durable disk card: a store's fdatasync overlaps the worker's next writes (session 36, brief behind36).
  bool overlaps_store_syncs() const override { return store_->durable() && !store_->memory_speed(); }
  StoreStats stats() const override { return store_->stats(); }

 private:
  std::shared_ptr<CardStore> store_;
};

}  // namespace adp
