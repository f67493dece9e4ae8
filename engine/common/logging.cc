#include "engine/common/logging.h"

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

std::optional<int64_t> LogLimiter::Allow(Clock::time_point now) {
  MutexLock lock(mu_);
  if (in_window_ == 0 || now - window_start_ >= interval_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++held_;
    return std::nullopt;
  }
  ++in_window_;
  const int64_t held = held_;
  held_ = 0;
  return held;
}

std::string LogLimiter::Held(int64_t held) {
  return held > 0 ? fmt::format(" ({} more like it held back before this one)", held) : "";
}

}  // namespace kolo
