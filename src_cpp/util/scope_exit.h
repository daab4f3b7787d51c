// SPDX-License-Identifier: Apache-2.0
// ScopeExit: runs a function when the scope ends, by return or by exception,
// unless released first. The card store undoes a half-made change with it
// when an allocation (std::bad_alloc) throws part way (session 26).
#pragma once

#include <utility>

namespace adp {

template <typename F>
class ScopeExit {
 public:
  explicit ScopeExit(F f) : f_(std::move(f)) {}
  ~ScopeExit() {
    if (armed_) f_();
  }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;
  // The change is complete: nothing to undo.
  void release() { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

}  // namespace adp
