#include "engine/common/logging.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace kolo {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
constexpr int kNoThreadRank = -2;
thread_local int t_rank = kNoThreadRank;
const char* LevelTag(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace:
      return "T";
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}
}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
void SetLogRank(int rank) {
  g_rank = rank;
  t_rank = rank;
}
void SetThreadLogRank(int rank) { t_rank = rank; }

void LogLine(LogLevel level, const std::string& text) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  const int rank = t_rank != kNoThreadRank ? t_rank : g_rank.load();
  std::string line =
      rank >= 0 ? fmt::format("[kolo {} {:02}:{:02}:{:02}.{:03} rank {}] {}\n", LevelTag(level),
                              tm.tm_hour, tm.tm_min, tm.tm_sec, ms, rank, text)
                : fmt::format("[kolo {} {:02}:{:02}:{:02}.{:03}] {}\n", LevelTag(level), tm.tm_hour,
                              tm.tm_min, tm.tm_sec, ms, text);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

RejectionLog::~RejectionLog() {
  int64_t held = 0;
  Clock::time_point start;
  {
    MutexLock lock(mu_);
    held = held_;
    start = window_start_;
    held_ = 0;
    pending_.store(0, std::memory_order_relaxed);
  }
  // The listener is closing: its last count is written now, whether or not its interval is over.
  if (held > 0 && LogLevel::kWarning >= GetLogLevel()) {
    LogLine(LogLevel::kWarning, CountLine(held, start, Clock::now()));
  }
}

std::string RejectionLog::CountLine(int64_t held, Clock::time_point start,
                                    Clock::time_point now) const {
  // The held-back rejections all came after `start`, so "the last N s" is true for N at least the
  // time since (rounded to the nearest second: the count is written within moments of the
  // interval's end, so this reads "10 s" with the default interval).
  const int64_t seconds = std::max<int64_t>(
      1, (std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count() + 500) / 1000);
  return fmt::format("{}: ... and {} more rejected connection{} in the last {} s", prefix_, held,
                     held == 1 ? "" : "s", seconds);
}

int64_t RejectionLog::TakeDue(Clock::time_point now, Clock::time_point* start) {
  if (held_ == 0 || now - window_start_ < interval_) return 0;
  const int64_t held = held_;
  *start = window_start_;
  held_ = 0;
  pending_.store(0, std::memory_order_relaxed);
  return held;
}

void RejectionLog::Reject(LogLevel level, const std::string& text, Clock::time_point now) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  int64_t due = 0;
  Clock::time_point due_start;
  bool write = false;
  {
    MutexLock lock(mu_);
    due = TakeDue(now, &due_start);
    if (in_window_ == 0 || now - window_start_ >= interval_) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ < burst_) {
      ++in_window_;
      write = true;
    } else {
      ++held_;
      pending_.store(held_, std::memory_order_relaxed);
    }
  }
  // Written outside the lock: a slow stderr holds up only this thread.
  if (due > 0 && LogLevel::kWarning >= GetLogLevel()) {
    LogLine(LogLevel::kWarning, CountLine(due, due_start, now));
  }
  if (write && level >= GetLogLevel()) LogLine(level, text);
}

void RejectionLog::Flush(Clock::time_point now) {
  // Called on every wake-up of a busy loop (the TCP device's progress): no lock unless a count is
  // pending.
  if (pending_.load(std::memory_order_relaxed) == 0) return;
  int64_t due = 0;
  Clock::time_point start;
  {
    MutexLock lock(mu_);
    due = TakeDue(now, &start);
  }
  if (due > 0 && LogLevel::kWarning >= GetLogLevel()) {
    LogLine(LogLevel::kWarning, CountLine(due, start, now));
  }
}

RejectionLog::Clock::time_point RejectionLog::next_flush() const {
  MutexLock lock(mu_);
  return held_ > 0 ? window_start_ + interval_ : Clock::time_point::max();
}

}  // namespace kolo
