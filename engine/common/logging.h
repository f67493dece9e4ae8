// Minimal leveled logging to stderr, prefixed with time and rank.
//
// KOLO_LOG(kInfo, "fusion threshold {} bytes", n);  Thread-safe: each call writes one line.
// The level threshold comes from Options (KOLO_LOG_LEVEL) via SetLogLevel().
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

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

// The log of one listener's turned-away connections: every way a listener rejects a connection (a
// wrong secret, garbage, silence past its bound, one connection too many, one after set-up, a
// failed accept) logs through its one RejectionLog, so that hundreds of idle or garbage
// connections from a local user write a few lines, not one each. At most `burst` lines per
// `interval`; the rest are counted, and once their interval is over one line says how many:
// "<prefix>: ... and K more rejected connections in the last 10 s". With the defaults a listener
// writes at most 5 lines per 10 s. Thread-safe.
class RejectionLog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kBurst = 4;
  static constexpr std::chrono::milliseconds kInterval{10000};

  // `prefix` names the listener in the count line ("store 127.0.0.1:4242").
  explicit RejectionLog(std::string prefix, int burst = kBurst,
                        std::chrono::milliseconds interval = kInterval)
      : prefix_(std::move(prefix)), burst_(burst), interval_(interval) {}
  // Writes the count of what is still held back, so that nothing counted goes unsaid.
  ~RejectionLog();
  RejectionLog(const RejectionLog&) = delete;
  RejectionLog& operator=(const RejectionLog&) = delete;

  // One rejected connection: writes `text` (the whole line, naming the listener) at `level` if
  // this interval has room, else counts it. A count due from an earlier interval comes first.
  void Reject(LogLevel level, const std::string& text, Clock::time_point now = Clock::now())
      KOLO_EXCLUDES(mu_);
  // Writes the count of an interval that is over, if any were held back in it; cheap when none
  // were. A listener's loop calls it when it wakes, so that the count does not wait for the next
  // rejection.
  void Flush(Clock::time_point now = Clock::now()) KOLO_EXCLUDES(mu_);
  // When Flush next has a count to write; Clock::time_point::max() when nothing is held back. A
  // listener's loop wakes by then.
  Clock::time_point next_flush() const KOLO_EXCLUDES(mu_);
  // Rejections so far, written or counted.
  int64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }
  // The listener's name, for the lines given to Reject to start with.
  const std::string& prefix() const { return prefix_; }

 private:
  // The count line for `held` rejections since the interval that began at `start`, or "" for none.
  std::string CountLine(int64_t held, Clock::time_point start, Clock::time_point now) const;
  // Takes the count of an interval that is over (0 if none is due), under mu_.
  int64_t TakeDue(Clock::time_point now, Clock::time_point* start) KOLO_REQUIRES(mu_);

  const std::string prefix_;
  const int burst_;
  const std::chrono::milliseconds interval_;
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> pending_{0};  // == held_, read without the lock by Flush's fast path
  mutable Mutex mu_;
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
