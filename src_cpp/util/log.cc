// SPDX-License-Identifier: Apache-2.0
#include "util/log.h"

#include <pthread.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace adp {
namespace {

LogLevel threshold_from_env() {
  const char* v = std::getenv("ADP_LOG_LEVEL");
  if (!v) return LogLevel::kInfo;
  if (!strcasecmp(v, "DEBUG")) return LogLevel::kDebug;
  if (!strcasecmp(v, "WARNING") || !strcasecmp(v, "WARN")) return LogLevel::kWarning;
  if (!strcasecmp(v, "ERROR")) return LogLevel::kError;
  return LogLevel::kInfo;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

// One line at a time. Taken by fork()'s prepare handler and given back in the parent and the child (fork40): a thread
// of the parent inside a line at the fork left it locked in the child for ever (no thread there to unlock it), and the
// child's first line (the connector's or the AIO writer's forked-child line) waited for good.
std::mutex g_line_mu;  // constant-initialized: a line logged before this file's initializers ran finds it
[[maybe_unused]] const int g_line_fork_safe = log_fork_handlers();

}  // namespace

int log_fork_handlers() {
  // Prepare handlers run in the reverse order of registration: this one, registered before every other handler that
  // takes a lock a thread may hold while it logs a line (each calls this first), runs after theirs, so the forking
  // thread takes the line's lock last. Registered after one of them (review40b: gateway_client.cc's ptracer record,
  // whose static initializer ran before this file's, the sources linked in name order), the forking thread held the
  // line's lock and waited for the record's while a registration held the record's and waited for the line's (its
  // WARNING): both for ever. It fails only without memory (ENOMEM): then a child may wait as before fork40.
  static const int registered =
      ::pthread_atfork([] { g_line_mu.lock(); }, [] { g_line_mu.unlock(); }, [] { g_line_mu.unlock(); });
  return registered;
}

bool log_enabled(LogLevel level) {
  static const LogLevel threshold = threshold_from_env();
  return static_cast<int>(level) >= static_cast<int>(threshold);
}

void log_message(LogLevel level, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);

  // The time is taken under the lock too: localtime_r takes glibc's time zone lock, which a fork does not give back
  // in the child either (a line of a thread of the parent's at the fork would have left it locked there).
  std::lock_guard<std::mutex> lock(g_line_mu);
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  localtime_r(&tv.tv_sec, &t);
  char ts[32];
  strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &t);
  fprintf(stderr, "[%s,%03ld] lmcache-adp %s: %s\n", ts, static_cast<long>(tv.tv_usec / 1000), level_name(level), msg);
  fflush(stderr);
}

bool LogRateLimit::allow(uint64_t* held_back) {
  int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
  int64_t next = next_ms_.load(std::memory_order_relaxed);
  if (now < next || !next_ms_.compare_exchange_strong(next, now + interval_ms_)) {
    held_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *held_back = held_.exchange(0);
  return true;
}

std::string log_safe(std::string_view s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; i++) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  if (s.size() > max_bytes) out += "...";
  return out;
}

std::string log_printable(std::string_view s, size_t max_bytes) {
  const bool printable =
      s.size() <= max_bytes && std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  return printable ? std::string(s) : log_safe(s, max_bytes);
}

}  // namespace adp
