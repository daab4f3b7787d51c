// SPDX-License-Identifier: Apache-2.0
// Minimal leveled logging to stderr, in the shape of LMCache's log lines, so
// the plugin's messages read alike inside `lmcache server` output.
// Level from ADP_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO).
// Thread-safe. Messages are state changes, never one line per request at INFO.
#pragma once

#include <cstdarg>
#include <string>
#include <string_view>

namespace adp {

enum class LogLevel { kDebug = 10, kInfo = 20, kWarning = 30, kError = 40 };

bool log_enabled(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Text from a peer (client name, key) made fit for a log line: bytes outside
// printable ASCII become \xNN and long text is cut, so a client cannot forge
// or garble log lines.
std::string log_safe(std::string_view s, size_t max_bytes = 200);

#define ADP_LOG(level, ...)                                                                                  \
  do {                                                                                                       \
    if (::adp::log_enabled(::adp::LogLevel::level)) ::adp::log_message(::adp::LogLevel::level, __VA_ARGS__); \
  } while (0)
#define ADP_DEBUG(...) ADP_LOG(kDebug, __VA_ARGS__)
#define ADP_INFO(...) ADP_LOG(kInfo, __VA_ARGS__)
#define ADP_WARN(...) ADP_LOG(kWarning, __VA_ARGS__)
#define ADP_ERROR(...) ADP_LOG(kError, __VA_ARGS__)

}  // namespace adp
