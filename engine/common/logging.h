// Minimal leveled logging to stderr, prefixed with time and rank.
//
// KOLO_LOG(kInfo, "fusion threshold {} bytes", n);  Thread-safe: each call writes one line.
// The level threshold comes from Options (KOLO_LOG_LEVEL) via SetLogLevel().
#pragma once

#include <fmt/format.h>

#include <string>

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

}  // namespace kolo

#define KOLO_LOG(level, ...)                                                \
  do {                                                                      \
    if (::kolo::LogLevel::level >= ::kolo::GetLogLevel())                   \
      ::kolo::LogLine(::kolo::LogLevel::level, ::fmt::format(__VA_ARGS__)); \
  } while (0)
