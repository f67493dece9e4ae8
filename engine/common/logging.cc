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

}  // namespace kolo
