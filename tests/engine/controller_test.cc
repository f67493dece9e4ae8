// kolo-test-links: kolo_coordinator
// The negotiation protocol on its own: coordinator::Controller for 1 to 4 ranks, each rank a
// thread, linked to the others by in-memory peers (no transport: this test links only the
// coordinator layer), with a hand-advanced clock so that stall times pass in no time.
#include "engine/coordinator/controller.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kolo::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class FakeClock final : public Clock {
 public:
  SteadyClock::time_point Now() override {
    return SteadyClock::time_point(SteadyClock::duration(ticks_.load()));
  }
  void Advance(SteadyClock::duration d) { ticks_ += d.count(); }

 private:
  std::atomic<SteadyClock::rep> ticks_{1'000'000'000'000};
};

// Every rank's contribution to one exchange, handed to all when the last arrives. Waits are
// bounded: ranks that call different operations (a protocol bug) fail instead of hanging.
class Exchange {
 public:
  explicit Exchange(int size, std::chrono::milliseconds timeout = 10s)
      : size_(size), timeout_(timeout) {}

  StatusOr<std::vector<std::vector<uint8_t>>> AllGather(int rank, std::vector<uint8_t> mine,
                                                        const char* op) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t round = round_;
    if (arrived_ == 0) {
      op_ = op;
      parts_.assign(static_cast<size_t>(size_), {});
    } else if (op_ != op) {
      return ProtocolError("rank {} called {} while others called {}", rank, op, op_);
    }
    parts_[static_cast<size_t>(rank)] = std::move(mine);
    ++calls_[op];
    if (++arrived_ == size_) {
      result_ = parts_;
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, timeout_, [&] { return round_ != round; })) {
      return DeadlineExceeded("rank {}: the other ranks never joined {}", rank, op);
    }
    return result_;
  }

  int calls(const std::string& op) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[op];
  }

 private:
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t round_ = 0;
  std::string op_;
  std::vector<std::vector<uint8_t>> parts_, result_;
  std::map<std::string, int> calls_;  // one per rank per call
};

class MemoryPeers final : public Peers {
 public:
  MemoryPeers(Exchange& ex, int rank) : ex_(ex), rank_(rank) {}

  Status BitwiseAllreduce(uint64_t* words, size_t and_words, size_t or_words) override {
    const size_t n = and_words + or_words;
    std::vector<uint8_t> mine(reinterpret_cast<uint8_t*>(words),
                              reinterpret_cast<uint8_t*>(words + n));
    KOLO_ASSIGN_OR_RETURN(auto all, ex_.AllGather(rank_, std::move(mine), "bits"));
    for (size_t w = 0; w < n; ++w) {
      uint64_t v = w < and_words ? ~uint64_t{0} : 0;
      for (const auto& part : all) {
        const uint64_t x = reinterpret_cast<const uint64_t*>(part.data())[w];
        v = w < and_words ? (v & x) : (v | x);
      }
      words[w] = v;
    }
    return Status::OK();
  }
  StatusOr<std::vector<std::vector<uint8_t>>> GatherAtRoot(
      const std::vector<uint8_t>& mine) override {
    KOLO_ASSIGN_OR_RETURN(auto all, ex_.AllGather(rank_, mine, "gather"));
    if (rank_ != 0) all.clear();
    return all;
  }
  StatusOr<std::vector<uint8_t>> BroadcastFromRoot(const std::vector<uint8_t>& message) override {
    KOLO_ASSIGN_OR_RETURN(auto all, ex_.AllGather(rank_, message, "broadcast"));
    return all[0];
  }

 private:
  Exchange& ex_;
  const int rank_;
};

Request Req(const std::string& name, Shape shape = {4, 4}) {
  Request r;
  r.name = name;
  r.shape = std::move(shape);
  return r;
}

std::vector<std::string> Names(const std::vector<Response>& rs) {
  std::vector<std::string> out;
  for (const Response& r : rs) out.push_back(r.request.name);
  return out;
}

// N ranks, each a Controller with in-memory peers and one shared fake clock.
class Job {
 public:
  // `capacities`, when given, sets each rank's cache capacity (ranks that disagree, which the
  // engine's start-up check refuses, to make ranks fall out of step).
  explicit Job(int size, ControllerSettings base = {}, std::vector<int> capacities = {})
      : size_(size), ex_(size) {
    for (int r = 0; r < size; ++r) {
      ControllerSettings s = base;
      s.rank = r;
      s.size = size;
      if (!capacities.empty()) s.cache_capacity = capacities[static_cast<size_t>(r)];
      peers_.push_back(std::make_unique<MemoryPeers>(ex_, r));
      controllers_.push_back(std::make_unique<Controller>(s, *peers_.back(), clock_));
    }
  }

  Controller& rank(int r) { return *controllers_[static_cast<size_t>(r)]; }
  FakeClock& clock() { return clock_; }
  Exchange& exchange() { return ex_; }

  // Adds `names[r]` on rank r, then runs one Negotiate on every rank at once.
  struct Cycle {
    std::vector<std::vector<Response>> responses;
    std::vector<Status> status;
    std::vector<NegotiationStats> stats;
    std::vector<bool> stop;
  };
  Cycle Run(const std::vector<std::vector<Request>>& adds, std::vector<bool> shutdown = {}) {
    shutdown.resize(static_cast<size_t>(size_), false);
    Cycle c;
    c.responses.resize(static_cast<size_t>(size_));
    c.status.resize(static_cast<size_t>(size_));
    c.stats.resize(static_cast<size_t>(size_));
    c.stop.resize(static_cast<size_t>(size_));
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&, r] {
        const auto i = static_cast<size_t>(r);
        if (i < adds.size()) {
          for (const Request& q : adds[i]) rank(r).Add(q, clock_.Now());
        }
        bool stop = false;
        c.status[i] = rank(r).Negotiate(shutdown[i], &c.responses[i], &stop, &c.stats[i]);
        c.stop[i] = stop;
      });
    }
    for (auto& t : threads) t.join();
    return c;
  }

 private:
  const int size_;
  FakeClock clock_;
  Exchange ex_;
  std::vector<std::unique_ptr<MemoryPeers>> peers_;
  std::vector<std::unique_ptr<Controller>> controllers_;
};

TEST(Controller, NewNamesGoThroughTheCoordinatorThenTheCacheInOneOrder) {
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE(size);
    Job job(size);
    // Every rank submits the same tensors in its own order.
    std::vector<std::vector<Request>> adds;
    for (int r = 0; r < size; ++r) {
      std::vector<Request> mine = {Req("a"), Req("b"), Req("c")};
      std::rotate(mine.begin(), mine.begin() + r % 3, mine.end());
      adds.push_back(mine);
    }
    auto first = job.Run(adds);
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(first.status[r].ok()) << first.status[r].ToString();
      EXPECT_EQ(first.stats[r].rounds, 1);
      EXPECT_EQ(first.stats[r].cache_hits, 0);
      EXPECT_EQ(Names(first.responses[r]), Names(first.responses[0]));
      EXPECT_EQ(first.responses[r].size(), 3u);
      EXPECT_EQ(job.rank(r).pending(), 0u);
    }
    const int gathers = job.exchange().calls("gather");
    // The same step again: agreed by the bit exchange alone, in cache-bit order on every rank.
    auto second = job.Run(adds);
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(second.status[r].ok()) << second.status[r].ToString();
      EXPECT_EQ(second.stats[r].rounds, 0);
      EXPECT_EQ(second.stats[r].cache_hits, 3);
      EXPECT_EQ(Names(second.responses[r]), Names(second.responses[0]));
    }
    EXPECT_EQ(job.exchange().calls("gather"), gathers) << "a cached step went to the coordinator";
  }
}

TEST(Controller, ATensorWaitsUntilEveryRankHasIt) {
  Job job(3);
  auto c1 = job.Run({{Req("a"), Req("b")}, {Req("a"), Req("b")}, {Req("a")}});
  for (int r = 0; r < 3; ++r) EXPECT_THAT(Names(c1.responses[r]), ElementsAre("a"));
  EXPECT_EQ(job.rank(0).pending(), 1u);
  EXPECT_EQ(job.rank(2).pending(), 0u);
  auto c2 = job.Run({{}, {}, {Req("b")}});
  for (int r = 0; r < 3; ++r) EXPECT_THAT(Names(c2.responses[r]), ElementsAre("b"));
  // Once cached, a tensor one rank is late with waits as a hit and is agreed when it comes.
  auto c3 = job.Run({{Req("a")}, {Req("a")}, {}});
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(c3.responses[r].empty());
  EXPECT_TRUE(job.rank(0).HasNews(job.clock().Now()) == false);
  auto c4 = job.Run({{}, {}, {Req("a")}});
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(Names(c4.responses[r]), ElementsAre("a"));
    EXPECT_EQ(c4.stats[r].cache_hits, 1);
  }
}

TEST(Controller, MismatchedRequestsFailOnEveryRankNamingBoth) {
  Job job(2);
  auto c = job.Run({{Req("w", {64, 3, 7, 7})}, {Req("w", {64, 3, 3, 3})}});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(c.status[r].ok());
    ASSERT_EQ(c.responses[r].size(), 1u);
    EXPECT_TRUE(c.responses[r][0].is_error());
    EXPECT_THAT(c.responses[r][0].error, HasSubstr("[64,3,7,7]"));
    EXPECT_THAT(c.responses[r][0].error, HasSubstr("[64,3,3,3]"));
    EXPECT_EQ(job.rank(r).pending(), 0u);
  }
}

TEST(Controller, ACachedRequestThatChangesIsRenegotiatedEverywhere) {
  Job job(2);
  job.Run({{Req("a")}, {Req("a")}});
  ASSERT_EQ(job.rank(0).cache().entries(), 1u);
  // Rank 1 now sends "a" with another shape: its cache lookup mismatches, every rank drops the
  // entry, and the coordinator sees both requests and fails the tensor.
  auto c = job.Run({{Req("a")}, {Req("a", {8})}});
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(c.responses[r].size(), 1u) << r;
    EXPECT_TRUE(c.responses[r][0].is_error());
    EXPECT_EQ(c.stats[r].rounds, 1);
  }
}

TEST(Controller, StalledTensorIsFailedAfterTheShutdownTimeNamingTheMissingRank) {
  ControllerSettings s;
  s.stall_warning_s = 2;
  s.stall_shutdown_s = 5;
  Job job(3, s);
  auto c1 = job.Run({{Req("x")}, {}, {Req("x")}});
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(c1.responses[r].empty());
  // Rank 0 has a table entry waiting: it wants a round at its next stall check, not before.
  EXPECT_FALSE(job.rank(0).HasNews(job.clock().Now()));
  EXPECT_EQ(job.rank(0).NextDue(), job.clock().Now() + Controller::kStallCheckEvery);
  EXPECT_EQ(job.rank(1).NextDue(), SteadyClock::time_point::max());
  job.clock().Advance(6s);
  EXPECT_TRUE(job.rank(0).HasNews(job.clock().Now()));
  // Past the shutdown time the job ends: every rank's Negotiate fails with one message naming the
  // stalled tensors and the ranks that have and lack them.
  auto c2 = job.Run({{}, {}, {}});
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(c2.status[r].ok()) << r;
    const std::string m = c2.status[r].ToString();
    EXPECT_THAT(m, HasSubstr("tensors stalled for up to 6.0 s (KOLO_STALL_SHUTDOWN_SECONDS=5)"));
    EXPECT_THAT(m, HasSubstr("'x' submitted by ranks 0,2, never by ranks 1"));
    EXPECT_TRUE(job.rank(r).FailedEverywhere()) << r;
    ASSERT_EQ(c2.responses[r].size(), 1u) << r;
    EXPECT_TRUE(c2.responses[r][0].is_error());
  }
  EXPECT_EQ(job.rank(0).pending(), 0u);
}

// Ranks whose caches differ would read different hits from the same bits, and run different
// collectives. The step check in every exchange stops them all at the first exchange after the
// caches diverged, before any collective runs, naming what each rank had agreed.
TEST(Controller, RanksOutOfStepStopAtTheNextExchangeNamingEachRank) {
  Job job(3, {}, {3, 3, 2});  // rank 2 evicts one entry the others keep
  auto c1 = job.Run({{Req("a"), Req("b"), Req("c")},
                     {Req("a"), Req("b"), Req("c")},
                     {Req("a"), Req("b"), Req("c")}});
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(c1.status[r].ok()) << c1.status[r].ToString();
    EXPECT_EQ(c1.responses[r].size(), 3u);
  }
  auto c2 = job.Run({{Req("a")}, {Req("a")}, {Req("a")}});
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(c2.status[r].ok()) << "rank " << r;
    EXPECT_TRUE(c2.responses[r].empty()) << "rank " << r << " was handed a collective";
    const std::string m = c2.status[r].ToString();
    EXPECT_THAT(m, HasSubstr("ranks are out of step"));
    EXPECT_THAT(m, HasSubstr("ranks 0,1: exchange 1, 3 collectives agreed, the last 'c'"));
    EXPECT_THAT(m, HasSubstr("rank 2: exchange 1, 3 collectives agreed, the last 'c'"));
    // Every rank knows why: the engine need not abort its peers.
    EXPECT_TRUE(job.rank(r).FailedEverywhere()) << r;
  }
}

// Ranks in step pass the check every exchange: many cycles of hits, misses and invalidations.
TEST(Controller, RanksInStepPassTheCheckThroughCacheChurn) {
  Job job(3, {}, {4, 4, 4});
  for (int step = 0; step < 20; ++step) {
    std::vector<Request> mine;
    for (int i = 0; i < 3; ++i) mine.push_back(Req(fmt::format("t{}", (step + i) % 7)));
    // Its shape changes every step: the cached entry is invalidated and renegotiated each time.
    mine.push_back(step % 2 ? Req("u", {8}) : Req("u"));
    auto c = job.Run({mine, mine, mine});
    for (int r = 0; r < 3; ++r)
      ASSERT_TRUE(c.status[r].ok()) << step << ": " << c.status[r].ToString();
    auto drain = job.Run({{}, {}, {}});
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(drain.status[r].ok()) << drain.status[r].ToString();
  }
}

// A rank that stopped leaves a whole step waiting: one warning line for the lot, naming a few.
TEST(Controller, StallWarningsAreOneLinePerSetOfMissingRanks) {
  ControllerSettings s;
  s.stall_warning_s = 2;
  s.stall_shutdown_s = 0;
  Job job(3, s);
  std::vector<Request> step;
  for (int i = 0; i < 20; ++i) step.push_back(Req(fmt::format("t{:02}", i)));
  job.Run({step, {}, step});
  job.clock().Advance(3s);
  ::testing::internal::CaptureStderr();
  job.Run({{}, {}, {}});
  const std::string log = ::testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (size_t at = 0; (at = log.find("stalled:", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, 1u) << log;
  EXPECT_THAT(log, HasSubstr("20 tensors ('t00', 't01', 't02' and 17 more)"));
  EXPECT_THAT(log, HasSubstr("ready on ranks 0,2, missing on ranks 1"));
  // Not again before another stall_warning_s has passed.
  job.clock().Advance(1500ms);
  ::testing::internal::CaptureStderr();
  job.Run({{}, {}, {}});
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("stalled:"), std::string::npos);
}

TEST(Controller, ACacheHitWaitingPastTheStallTimeIsHandedBackAndFailed) {
  ControllerSettings s;
  s.stall_warning_s = 0;  // only the shutdown time
  s.stall_shutdown_s = 5;
  Job job(2, s);
  job.Run({{Req("a")}, {Req("a")}});
  job.Run({{Req("a")}, {Req("a")}});         // now a cache hit
  auto waiting = job.Run({{Req("a")}, {}});  // rank 1 stops submitting it
  EXPECT_TRUE(waiting.responses[0].empty());
  const auto due = job.rank(0).NextDue();
  EXPECT_EQ(due, job.clock().Now() + 5s);
  EXPECT_FALSE(job.rank(0).HasNews(job.clock().Now() + 4s));
  job.clock().Advance(6s);
  EXPECT_TRUE(job.rank(0).HasNews(job.clock().Now()));
  // The hit is dropped from every rank's cache and reported with its 6 s of waiting, so the
  // coordinator's stall inspector fails it at once, naming rank 1.
  auto c = job.Run({{}, {}});
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(c.status[r].ok()) << r;
    EXPECT_TRUE(job.rank(r).FailedEverywhere()) << r;
    EXPECT_THAT(c.status[r].ToString(), HasSubstr("'a' submitted by ranks 0, never by ranks 1"));
    ASSERT_EQ(c.responses[r].size(), 1u) << r;
    EXPECT_TRUE(c.responses[r][0].is_error());
  }
  EXPECT_EQ(job.rank(0).cache().entries(), 0u);
  EXPECT_EQ(job.rank(1).cache().entries(), 0u);
}

TEST(Controller, OneRanksShutdownStopsEveryRank) {
  Job job(3);
  auto c = job.Run({{}, {}, {}}, {false, true, false});
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(c.status[r].ok());
    EXPECT_TRUE(c.stop[r]) << r;
    EXPECT_EQ(job.rank(r).ShutDownBy(), 1) << r;  // every rank knows which one asked
  }
  Job two(3);
  two.Run({{}, {}, {}}, {true, false, true});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(two.rank(r).ShutDownBy(), Controller::kSeveralRanks) << r;
  auto quiet = job.Run({{}, {}, {}});
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(quiet.stop[r]);
}

TEST(Controller, ASingleRankAgreesWithNobodyInAddOrder) {
  Job job(1);
  auto c = job.Run({{Req("z"), Req("a"), Req("m")}}, {true});
  ASSERT_TRUE(c.status[0].ok());
  EXPECT_THAT(Names(c.responses[0]), ElementsAre("z", "a", "m"));
  EXPECT_TRUE(c.stop[0]);
  EXPECT_EQ(job.exchange().calls("bits"), 0);
}

TEST(Controller, APeerFailureIsReturned) {
  // A rank whose peers never join its exchange gets the peers' error back, not a hang.
  Exchange ex(2, 200ms);
  MemoryPeers peers(ex, 0);
  FakeClock clock;
  ControllerSettings s;
  s.size = 2;
  Controller c(s, peers, clock);
  c.Add(Req("a"), clock.Now());
  std::vector<Response> responses;
  bool stop = false;
  NegotiationStats stats;
  Status st = c.Negotiate(false, &responses, &stop, &stats);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  // Not an error every rank reaches on its own: the engine must tell its peers (abort).
  EXPECT_FALSE(c.FailedEverywhere());
}

}  // namespace
}  // namespace kolo::coordinator
