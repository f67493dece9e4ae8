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

// Lines of `out` that contain `what`.
int CountLines(const std::string& out, const std::string& what) {
  int n = 0;
  for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
  return n;
}

// A flood within one interval writes the burst; the count of the rest follows once the interval is
// over (on the next rejection or a Flush, whichever comes first), once; then a new burst.
TEST(RejectionLog, WritesABurstPerIntervalThenOneLineCountingTheRest) {
  using std::chrono::milliseconds;
  const auto t0 = RejectionLog::Clock::time_point{} + std::chrono::hours(1);
  ::testing::internal::CaptureStderr();
  {
    RejectionLog log("store 127.0.0.1:1", 4, milliseconds(10000));
    EXPECT_EQ(log.next_flush(), RejectionLog::Clock::time_point::max());
    for (int i = 0; i < 300; ++i) {
      log.Reject(LogLevel::kWarning, fmt::format("store 127.0.0.1:1: idle connection {}", i),
                 t0 + milliseconds(i));
    }
    EXPECT_EQ(log.rejected(), 300);
    EXPECT_EQ(log.next_flush(), t0 + milliseconds(10000));
    log.Flush(t0 + milliseconds(9999));  // the interval is not over: nothing yet
    const std::string burst = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(CountLines(burst, "idle connection"), 4) << burst;
    EXPECT_EQ(CountLines(burst, "more rejected"), 0) << burst;

    ::testing::internal::CaptureStderr();
    log.Flush(t0 + milliseconds(10000));
    log.Flush(t0 + milliseconds(10001));  // once
    EXPECT_EQ(log.next_flush(), RejectionLog::Clock::time_point::max());
    const std::string count = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(CountLines(count, "\n"), 1) << count;
    EXPECT_EQ(CountLines(count,
                         "store 127.0.0.1:1: ... and 296 more rejected connections in the "
                         "last 10 s\n"),
              1)
        << count;

    // The next interval: a burst again; its count comes first on the rejection after it ends.
    ::testing::internal::CaptureStderr();
    for (int i = 0; i < 5; ++i) {
      log.Reject(LogLevel::kWarning, "store 127.0.0.1:1: garbage", t0 + milliseconds(20000 + i));
    }
    log.Reject(LogLevel::kWarning, "store 127.0.0.1:1: late", t0 + milliseconds(31000));
    const std::string next = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(CountLines(next, "garbage"), 4) << next;
    const size_t counted = next.find("... and 1 more rejected connection in the last 11 s");
    ASSERT_NE(counted, std::string::npos) << next;
    EXPECT_LT(counted, next.find("late")) << "the count comes before the line that follows it";
    // What is held back when the listener closes is counted then.
    ::testing::internal::CaptureStderr();
    for (int i = 0; i < 10; ++i) {
      log.Reject(LogLevel::kWarning, "store 127.0.0.1:1: more", t0 + milliseconds(31001 + i));
    }
  }
  const std::string closing = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(CountLines(closing, ": more\n"), 3) << closing;
  EXPECT_NE(closing.find("... and 7 more rejected connections"), std::string::npos) << closing;
}

TEST(RejectionLog, LinesBelowTheLevelAreCountedNotWritten) {
  const LogLevel saved = GetLogLevel();
  SetLogLevel(LogLevel::kError);
  ::testing::internal::CaptureStderr();
  {
    RejectionLog log("rank 0: TCP listener");
    for (int i = 0; i < 10; ++i) log.Reject(LogLevel::kWarning, "rank 0: rejected");
    EXPECT_EQ(log.rejected(), 10);
  }
  SetLogLevel(saved);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace kolo
