// Minimal leveled logging to stderr, prefixed with time and rank.
//
// KOLO_LOG(kInfo, "fusion threshold {} bytes", n);  Thread-safe: each call writes one line.
// The level threshold comes from Options (KOLO_LOG_LEVEL) via SetLogLevel().
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "engine/common/mutex.h"

namespace kolo {

enum class LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Rank shown in every line; -1 (the default) shows none. Sets the process's rank and the calling
// thread's (a thread's own rank wins, so ranks run as threads in one process each log their own).
void SetLogRank(int rank);
// The rank shown in lines the calling thread writes, whatever the process's rank is.
void SetThreadLogRank(int rank);
void LogLine(LogLevel level, const std::string& text);

// Bounds how many lines one kind of event may log (a flood of rejected connections from a local
// user must not flood the job's log): at most `burst` per `interval`; the events held back are
// counted and the next line let through says how many. Thread-safe.
class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  LogLimiter(int burst, std::chrono::milliseconds interval) : burst_(burst), interval_(interval) {}
  // Whether this event may log now: the number of events held back since the last one let
  // through (0 or more), or nothing when this one is held back too.
  std::optional<int64_t> Allow(Clock::time_point now = Clock::now()) KOLO_EXCLUDES(mu_);
  // ", N more held back" when `held` > 0, for the end of the line let through.
  static std::string Held(int64_t held);

 private:
  const int burst_;
  const std::chrono::milliseconds interval_;
  Mutex mu_;
  Clock::time_point window_start_ KOLO_GUARDED_BY(mu_){};
  int in_window_ KOLO_GUARDED_BY(mu_) = 0;
  int64_t held_ KOLO_GUARDED_BY(mu_) = 0;
};

}  // namespace kolo

#define KOLO_LOG(level, ...)                                                \
  do {                                                                      \
    if (::kolo::LogLevel::level >= ::kolo::GetLogLevel())                   \
      ::kolo::LogLine(::kolo::LogLevel::level, ::fmt::format(__VA_ARGS__)); \
  } while (0)
