// SPDX-License-Identifier: Apache-2.0
// Minimal leveled logging to stderr, in the shape of LMCache's log lines, so
// the plugin's messages read alike inside `lmcache server` output.
// Level from ADP_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO).
// Thread-safe. Messages are state changes, never one line per request at INFO.
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <string>
#include <string_view>

namespace adp {

enum class LogLevel { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40 };

bool log_enabled(LogLevel level);
// Registers the fork handlers of the line's lock (pthread_atfork: taken before a fork, given back after it in the
// parent and the child), once; returns pthread_atfork's result. Every other fork handler of this library that takes a
// lock a thread may hold while it logs calls this before its own pthread_atfork (review40b), so that the line's lock
// is the last one a fork takes. Also made as the library is loaded.
int log_fork_handlers();
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Text from a peer (client name, key) made fit for a log line: bytes outside
// printable ASCII become \xNN and long text is cut, so a client cannot forge
// or garble log lines.
std::string log_safe(std::string_view s, size_t max_bytes = 200);
// A text already made printable (a peer's reason with log_safe's \xNN escapes in it: a segment's refusal) as it is,
// where it is printable ASCII only (0x20-0x7e) and at most max_bytes; any other through log_safe(s, max_bytes). So
// such a reason is logged as its Error frame has it, not its escapes' backslashes escaped again (review38).
std::string log_printable(std::string_view s, size_t max_bytes);

// Lets one line through per interval at a call site and counts the lines it
// held back, so a peer or a stream of bad requests cannot flood the log with
// a line per connection or per item. Thread-safe.
class LogRateLimit {
 public:
  explicit LogRateLimit(int64_t interval_ms = 10000) : interval_ms_(interval_ms) {}
  // True if a line may be logged now; *held_back: lines held back before it.
  bool allow(uint64_t* held_back);

 private:
  const int64_t interval_ms_;
  std::atomic<int64_t> next_ms_{0};
  std::atomic<uint64_t> held_{0};
};

#define ADP_LOG(level, ...)                                                                                  \
  do {                                                                                                       \
    if (::adp::log_enabled(::adp::LogLevel::level)) ::adp::log_message(::adp::LogLevel::level, __VA_ARGS__); \
  } while (0)
#define ADP_DEBUG(...) ADP_LOG(kDebug, __VA_ARGS__)
#define ADP_INFO(...) ADP_LOG(kInfo, __VA_ARGS__)
#define ADP_WARN(...) ADP_LOG(kWarning, __VA_ARGS__)
#define ADP_ERROR(...) ADP_LOG(kError, __VA_ARGS__)
// A warning at most once per 10 s from this call site; the next one that is
// let through says how many were held back.
#define ADP_WARN_LIMITED(fmt, ...)                                                                \
  do {                                                                                            \
    static ::adp::LogRateLimit adp_rate_limit_;                                                   \
    uint64_t adp_held_;                                                                           \
    if (::adp::log_enabled(::adp::LogLevel::kWarning) && adp_rate_limit_.allow(&adp_held_))       \
      ::adp::log_message(::adp::LogLevel::kWarning, fmt " [%llu like it held back]", __VA_ARGS__, \
                         static_cast<unsigned long long>(adp_held_));                             \
  } while (0)

}  // namespace adp
