// Log lines name the rank of the thread that writes them.
#include "engine/common/logging.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace kolo {
namespace {

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    level_ = GetLogLevel();
    SetLogLevel(LogLevel::kInfo);
  }
  void TearDown() override {
    SetLogRank(-1);
    SetLogLevel(level_);
  }

 private:
  LogLevel level_ = LogLevel::kWarning;
};

// Runs fn on a new thread and returns what it wrote to stderr.
template <typename Fn>
std::string StderrOfThread(Fn fn) {
  ::testing::internal::CaptureStderr();
  std::thread(fn).join();
  return ::testing::internal::GetCapturedStderr();
}

TEST_F(LoggingTest, AThreadWithoutItsOwnRankShowsTheProcessRank) {
  SetLogRank(7);
  const std::string out = StderrOfThread([] { KOLO_LOG(kInfo, "hello"); });
  EXPECT_NE(out.find(" rank 7] hello\n"), std::string::npos) << out;
}

TEST_F(LoggingTest, EachThreadShowsItsOwnRankWhateverTheProcessRankIs) {
  SetLogRank(7);
  // Two "ranks" as threads: each sets its rank, then both log after the process rank changed.
  std::string out;
  ::testing::internal::CaptureStderr();
  {
    std::thread a([] {
      SetThreadLogRank(0);
      KOLO_LOG(kInfo, "from zero");
    });
    std::thread b([] {
      SetThreadLogRank(1);
      KOLO_LOG(kInfo, "from one");
    });
    a.join();
    b.join();
  }
  SetLogRank(3);
  KOLO_LOG(kInfo, "from the process");
  out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find(" rank 0] from zero\n"), std::string::npos) << out;
  EXPECT_NE(out.find(" rank 1] from one\n"), std::string::npos) << out;
  EXPECT_NE(out.find(" rank 3] from the process\n"), std::string::npos) << out;
}

TEST_F(LoggingTest, NoRankShowsNone) {
  SetLogRank(-1);
  const std::string out = StderrOfThread([] { KOLO_LOG(kInfo, "plain"); });
  EXPECT_EQ(out.find("rank"), std::string::npos) << out;
  EXPECT_NE(out.find("] plain\n"), std::string::npos) << out;
}

TEST_F(LoggingTest, LinesBelowTheLevelAreDropped) {
  SetLogLevel(LogLevel::kWarning);
  const std::string out = StderrOfThread([] { KOLO_LOG(kInfo, "quiet"); });
  EXPECT_EQ(out, "");
}

TEST(LogLimiter, LetsABurstThroughPerIntervalAndCountsTheRest) {
  using std::chrono::milliseconds;
  LogLimiter limiter(3, milliseconds(1000));
  const auto t0 = LogLimiter::Clock::time_point{} + std::chrono::hours(1);
  int passed = 0;
  for (int i = 0; i < 100; ++i) passed += limiter.Allow(t0 + milliseconds(i)).has_value() ? 1 : 0;
  EXPECT_EQ(passed, 3) << "a flood within one interval logs only the burst";
  // The next interval's first line says how many were held back, once.
  auto next = limiter.Allow(t0 + milliseconds(1500));
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, 97);
  EXPECT_NE(LogLimiter::Held(*next).find("97 more"), std::string::npos);
  auto after = limiter.Allow(t0 + milliseconds(1501));
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(*after, 0);
  EXPECT_EQ(LogLimiter::Held(0), "");
}

}  // namespace
}  // namespace kolo
