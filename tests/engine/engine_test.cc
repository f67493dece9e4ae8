// The engine end to end, ranks as threads in one process over real TCP on loopback.
#include "engine/engine.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "engine/common/logging.h"
#include "engine/transport/shm/host_area.h"
#include "tests/engine/engine_test_util.h"

namespace kolo {
namespace {

using testing::ExpectedSum;
using testing::MakeInput;
using testing::RankOptions;
using testing::RunRanks;

std::string DescribeCase(DataType d, size_t count, int ranks) {
  return fmt::format("{} count {} ranks {}", DataTypeName(d), count, ranks);
}

// --- Results against a reference: every dtype, awkward sizes, 1..8 ranks. ---
class AllreduceResult : public ::testing::TestWithParam<std::tuple<int, DataType>> {};

TEST_P(AllreduceResult, MatchesReferenceForAwkwardSizes) {
  const auto [size, dtype] = GetParam();
  std::vector<size_t> counts = {0, 1, 7, 1000003};
  for (size_t extra : {static_cast<size_t>(size - 1), static_cast<size_t>(size + 1)}) {
    if (std::find(counts.begin(), counts.end(), extra) == counts.end()) counts.push_back(extra);
  }
  RunRanks(size, [&, size = size, dtype = dtype](int rank, Engine& engine) {
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<Handle> handles;
    for (size_t c : counts) {
      bufs.push_back(MakeInput(dtype, c, rank));
      auto h = engine.AllreduceAsync(fmt::format("t{}", c), bufs.back().data(), bufs.back().data(),
                                     dtype, {static_cast<int64_t>(c)}, ReduceOp::kSum);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      handles.push_back(*h);
    }
    for (size_t k = 0; k < counts.size(); ++k) {
      ASSERT_TRUE(engine.Wait(handles[k]).ok());
      size_t wrong = 0;
      for (size_t i = 0; i < counts[k]; ++i) {
        if (LoadElement(dtype, bufs[k].data(), i) != ExpectedSum(size, i)) ++wrong;
      }
      EXPECT_EQ(wrong, 0u) << DescribeCase(dtype, counts[k], size) << " rank " << rank;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(RanksByDtype, AllreduceResult,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::ValuesIn(AllDataTypes())),
                         [](const auto& info) {
                           return fmt::format("np{}_{}", std::get<0>(info.param),
                                              DataTypeName(std::get<1>(info.param)));
                         });

TEST(Engine, Allreduce64MiBFloat32) {
  const size_t count = (64u << 20) / 4;
  for (int size : {2, 4}) {
    RunRanks(size, [&](int rank, Engine& engine) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(testing::InputValue(rank, i));
      auto h = engine.AllreduceAsync("big", buf.data(), buf.data(), DataType::kFloat32,
                                     {static_cast<int64_t>(count)}, ReduceOp::kSum);
      ASSERT_TRUE(h.ok());
      ASSERT_TRUE(engine.Wait(*h).ok());
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) wrong += buf[i] != ExpectedSum(size, i);
      EXPECT_EQ(wrong, 0u) << "size " << size;
    });
  }
}

// Hierarchical allreduce through the whole engine: 2 hosts x 2 ranks (host names given per rank),
// several tensors fused and one large tensor, each checked against the reference.
TEST(Engine, HierarchicalAllreduceMatchesReference) {
  RunRanks(
      4,
      [](int r) {
        Options o = testing::RankOptions(r, 4);
        o.host_name = r < 2 ? "left" : "right";
        o.hierarchical_allreduce = true;
        return o;
      },
      [](int rank, Engine& engine) {
        std::vector<std::vector<float>> bufs;
        std::vector<Handle> handles;
        for (size_t count : {size_t{3}, size_t{1000}, size_t{5}, size_t{1} << 20}) {
          bufs.emplace_back(count);
          auto& b = bufs.back();
          for (size_t i = 0; i < count; ++i)
            b[i] = static_cast<float>(testing::InputValue(rank, i));
          auto h = engine.AllreduceAsync(fmt::format("t{}", count), b.data(), b.data(),
                                         DataType::kFloat32, {static_cast<int64_t>(count)},
                                         ReduceOp::kSum);
          ASSERT_TRUE(h.ok()) << h.status().ToString();
          handles.push_back(*h);
        }
        for (Handle h : handles) ASSERT_TRUE(engine.Wait(h).ok());
        for (const auto& b : bufs) {
          size_t wrong = 0;
          for (size_t i = 0; i < b.size(); ++i) wrong += b[i] != ExpectedSum(4, i);
          EXPECT_EQ(wrong, 0u) << "rank " << rank << ", " << b.size() << " elements";
        }
      });
}

TEST(Engine, HierarchicalAllreduceRefusesUnevenHosts) {
  bootstrap::InMemoryStore store;
  std::vector<Status> statuses(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      Options o = testing::RankOptions(r, 3);
      o.host_name = r < 2 ? "big" : "small";
      o.hierarchical_allreduce = true;
      o.peer_timeout_s = 5;
      statuses[static_cast<size_t>(r)] = Engine::Create(o, &store).status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    const Status& s = statuses[static_cast<size_t>(r)];
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << s.ToString();
    EXPECT_NE(s.message().find("big: ranks 0-1, small: rank 2"), std::string::npos) << s.ToString();
  }
}

TEST(Engine, AverageDividesBySize) {
  RunRanks(4, [](int rank, Engine& engine) {
    std::vector<double> in(1000), out(1000, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = rank * 10.0 + static_cast<double>(i);
    std::vector<int32_t> iin(5, rank + 1), iout(5);
    auto h1 = engine.AllreduceAsync("avg", in.data(), out.data(), DataType::kFloat64, {1000},
                                    ReduceOp::kAverage);
    auto h2 = engine.AllreduceAsync("iavg", iin.data(), iout.data(), DataType::kInt32, {5},
                                    ReduceOp::kAverage);
    ASSERT_TRUE(h1.ok() && h2.ok());
    ASSERT_TRUE(engine.Wait(*h1).ok());
    ASSERT_TRUE(engine.Wait(*h2).ok());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_DOUBLE_EQ(out[i], 15.0 + i);
    for (int32_t v : iout) EXPECT_EQ(v, 2);  // (1+2+3+4)/4 = 2.5, truncated
    EXPECT_EQ(in[3], rank * 10.0 + 3) << "input must be left unchanged";
  });
}

// Small allreduces ride the negotiation's bit exchange where every rank offers the same cached
// tensors: the results are those of the collectives they replace. KOLO_RIDING_MAX_BYTES=0, an
// allreduce algorithm chosen by hand, or ranks all on one host over shared memory turn it off.
TEST(Engine, SmallAllreducesRideTheNegotiation) {
  struct Case {
    const char* transport;
    int64_t max_bytes;
    const char* algorithm;
    bool rides;
  };
  for (const Case& c : {Case{"tcp", 32 << 10, "auto", true}, Case{"tcp", 0, "auto", false},
                        Case{"tcp", 32 << 10, "recursive-doubling", false},
                        // One host over shared memory: the exchange goes through the host
                        // area, and the payload with it (the area is opened through /proc).
                        Case{"auto", 32 << 10, "auto", ::access("/proc/self/fd", R_OK) == 0},
                        Case{"auto", 0, "auto", false}}) {
    SCOPED_TRACE(fmt::format("transport {}, riding up to {} bytes, algorithm {}", c.transport,
                             c.max_bytes, c.algorithm));
    std::vector<int64_t> riding(4, -1);
    RunRanks(
        4,
        [&](int r) {
          Options o = RankOptions(r, 4);
          o.transport = c.transport;
          o.riding_max_bytes = c.max_bytes;
          o.allreduce_algorithm = c.algorithm;
          return o;
        },
        [&](int rank, Engine& engine) {
          for (int step = 0; step < 30; ++step) {
            std::vector<float> in(256), out(256, -1);
            for (size_t i = 0; i < in.size(); ++i) in[i] = rank + 0.25f * static_cast<float>(i);
            std::vector<double> din(10, rank + step), dout(10, -1);
            auto h1 = engine.AllreduceAsync("ride", in.data(), out.data(), DataType::kFloat32,
                                            {256}, ReduceOp::kAverage);
            ASSERT_TRUE(h1.ok());
            ASSERT_TRUE(engine.Wait(*h1).ok());
            auto h2 = engine.AllreduceAsync("ride64", din.data(), dout.data(), DataType::kFloat64,
                                            {10}, ReduceOp::kSum);
            ASSERT_TRUE(h2.ok());
            ASSERT_TRUE(engine.Wait(*h2).ok());
            for (size_t i = 0; i < out.size(); ++i) {
              ASSERT_FLOAT_EQ(out[i], 1.5f + 0.25f * static_cast<float>(i)) << i;
            }
            for (double v : dout) ASSERT_DOUBLE_EQ(v, 6.0 + 4.0 * step);
          }
          riding[static_cast<size_t>(rank)] = engine.stats().riding_collectives;
        });
    for (int r = 0; r < 4; ++r) {
      if (c.rides) {
        // Every allreduce after the first of each name (a cache miss) rides.
        EXPECT_GE(riding[static_cast<size_t>(r)], 50) << "rank " << r;
      } else {
        EXPECT_EQ(riding[static_cast<size_t>(r)], 0) << "rank " << r;
      }
    }
  }
}

// Ranks all on one host over shared memory map a host-wide area, and small allreduces run one-shot
// through it (auto picks it up to kOneShotMaxBytes; one-shot by hand runs every size in pieces).
// Where the ranks span hosts, or the transport is TCP, one-shot by hand is refused at start-up
// naming what is allowed.
TEST(Engine, OneShotAllreducesOnOneHostAndRefusedElsewhere) {
  if (::access("/proc/self/fd", R_OK) != 0) {
    GTEST_SKIP() << "/proc/self/fd is not readable here: the host-wide area is opened through it";
  }
  for (const char* algorithm : {"one-shot", "auto"}) {
    SCOPED_TRACE(algorithm);
    RunRanks(
        4,
        [&](int r) {
          Options o = RankOptions(r, 4);
          o.allreduce_algorithm = algorithm;
          return o;
        },
        [&](int rank, Engine& engine) {
          // The area is part of the transport memory the engine reports.
          EXPECT_GE(engine.stats().transport_memory_bytes,
                    static_cast<int64_t>(transport::shm::HostAreaBytes(4, 32 << 10)));
          for (size_t count : {size_t{1}, size_t{1000}, size_t{20000}}) {
            for (int step = 0; step < 5; ++step) {
              std::vector<float> in(count), out(count, -1);
              for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank * 3 + i % 11);
              auto h = engine.AllreduceAsync(fmt::format("os.{}", count), in.data(), out.data(),
                                             DataType::kFloat32, {static_cast<int64_t>(count)},
                                             ReduceOp::kAverage);
              ASSERT_TRUE(h.ok());
              ASSERT_TRUE(engine.Wait(*h).ok());
              for (size_t i = 0; i < count; ++i) {
                ASSERT_FLOAT_EQ(out[i], 4.5f + static_cast<float>(i % 11)) << count << " " << i;
              }
            }
          }
        });
  }
  // Two hosts: no host area, so one-shot cannot run.
  auto statuses = kolo::testing::CreateStatuses(4, [](int r) {
    Options o = RankOptions(r, 4);
    o.host_name = r < 2 ? "left" : "right";
    o.allreduce_algorithm = "one-shot";
    return o;
  });
  for (const Status& s : statuses) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("'one-shot' needs every rank on one host"), std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find("allowed are auto, ring"), std::string::npos) << s.ToString();
  }
  Options tcp = RankOptions(0, 4);
  tcp.transport = "tcp";
  tcp.allreduce_algorithm = "one-shot";
  Status v = tcp.Validate();
  EXPECT_EQ(v.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.message().find("transport 'tcp'"), std::string::npos) << v.ToString();
}

// Hierarchical allreduce over several hosts with shared memory within each: every host's ranks map
// an area of their own, and small allreduces run one-shot within the host, then by recursive
// doubling across hosts (3 hosts: the fold of a count that is not a power of two); large ones
// keep the rings. Results exact; the timeline holds both paths' phases.
TEST(Engine, HierarchicalSmallAllreducesGoOneShotWithinHosts) {
  if (::access("/proc/self/fd", R_OK) != 0) {
    GTEST_SKIP() << "/proc/self/fd is not readable here: the host-wide area is opened through it";
  }
  struct Shape {
    int hosts;
    int per_host;
  };
  for (const Shape shape : {Shape{2, 4}, Shape{3, 2}}) {
    const int n = shape.hosts * shape.per_host;
    SCOPED_TRACE(fmt::format("{} hosts x {} ranks", shape.hosts, shape.per_host));
    const std::string base = ::testing::TempDir() + "/kolo_hier_small.json";
    RunRanks(
        n,
        [&](int r) {
          Options o = RankOptions(r, n);
          o.host_name = fmt::format("h{}", r / shape.per_host);
          o.hierarchical_allreduce = true;
          o.timeline_path = base;
          return o;
        },
        [&](int rank, Engine& engine) {
          EXPECT_GE(engine.stats().transport_memory_bytes,
                    static_cast<int64_t>(transport::shm::HostAreaBytes(shape.per_host, 32 << 10)));
          for (size_t count : {size_t{1}, size_t{1000}, size_t{16000}, size_t{300000}}) {
            std::vector<float> in(count), out(count, -1);
            for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank + i % 13);
            auto h = engine.AllreduceAsync(fmt::format("hs.{}", count), in.data(), out.data(),
                                           DataType::kFloat32, {static_cast<int64_t>(count)},
                                           ReduceOp::kSum);
            ASSERT_TRUE(h.ok());
            ASSERT_TRUE(engine.Wait(*h).ok());
            const float ranks_sum = static_cast<float>(n * (n - 1) / 2);
            for (size_t i = 0; i < count; i += 7) {
              ASSERT_EQ(out[i], ranks_sum + static_cast<float>(n * static_cast<int>(i % 13)))
                  << count << " " << i;
            }
          }
        });
    for (int rank = 0; rank < n; ++rank) {
      const std::string path =
          rank == 0 ? base
                    : ::testing::TempDir() + fmt::format("/kolo_hier_small.rank{}.json", rank);
      std::ifstream in(path);
      ASSERT_TRUE(in) << path;
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (const char* phase : {"ONE_SHOT", "RECURSIVE_DOUBLING", "HIERARCHICAL_ALLREDUCE"}) {
        EXPECT_NE(text.find(phase), std::string::npos) << phase << " missing from " << path;
      }
      std::filesystem::remove(path);
    }
  }
}

TEST(Engine, DifferentSubmissionOrdersComplete) {
  RunRanks(3, [](int rank, Engine& engine) {
    const int n = 40;
    std::vector<std::vector<float>> bufs(n, std::vector<float>(100 + 17 * 3, 1.0f));
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::mt19937 rng(rank * 7919 + 1);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Handle> hs(n);
    for (int i : order) {
      auto h = engine.AllreduceAsync(fmt::format("g{}", i), bufs[i].data(), bufs[i].data(),
                                     DataType::kFloat32, {static_cast<int64_t>(bufs[i].size())},
                                     ReduceOp::kSum);
      ASSERT_TRUE(h.ok());
      hs[i] = *h;
    }
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(engine.Wait(hs[i]).ok());
      EXPECT_EQ(bufs[i][0], 3.0f);
    }
  });
}

// A caller that waits on each small allreduce drives the engine's cycles itself
// (KOLO_CALLER_PROGRESS, on by default): the results are the same, and the cycles it ran are
// counted. With the option off, every cycle runs on the background thread.
TEST(Engine, WaitingCallersDriveTheCycles) {
  for (const char* transport : {"tcp", "shm"}) {
    for (const bool caller_progress : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, caller progress {}", transport, caller_progress));
      std::vector<int64_t> by_caller(4, -1);
      RunRanks(
          4,
          [&](int r) {
            Options o = RankOptions(r, 4);
            o.transport = transport;
            o.caller_progress = caller_progress;
            return o;
          },
          [&](int rank, Engine& engine) {
            for (int step = 0; step < 200; ++step) {
              std::vector<float> v(64, static_cast<float>(rank + step));
              auto h = engine.AllreduceAsync("drive", v.data(), v.data(), DataType::kFloat32, {64},
                                             ReduceOp::kSum);
              ASSERT_TRUE(h.ok()) << h.status().ToString();
              ASSERT_TRUE(engine.Wait(*h).ok());
              for (float x : v) ASSERT_FLOAT_EQ(x, 6.0f + 4.0f * static_cast<float>(step));
            }
            const Engine::Stats st = engine.stats();
            EXPECT_LE(st.caller_cycles, st.cycles);
            by_caller[static_cast<size_t>(rank)] = st.caller_cycles;
          });
      for (int r = 0; r < 4; ++r) {
        if (caller_progress) {
          // A caller back within the linger takes the drive; on a loaded machine not every time.
          EXPECT_GT(by_caller[static_cast<size_t>(r)], 0) << "rank " << r;
        } else {
          EXPECT_EQ(by_caller[static_cast<size_t>(r)], 0) << "rank " << r;
        }
      }
    }
  }
}

// A driving caller keeps to its wait's timeout although its peer has not submitted yet (the
// peer's engine joins the exchange and the cycle ends without the tensor), and the operation goes
// on: the background thread completes it once the peer submits. A caller drives only with at
// least the peer timeout left (a started cycle is bounded by it), so the wait here is longer.
TEST(Engine, ADrivingCallerKeepsToItsTimeout) {
  RunRanks(
      2,
      [](int r) {
        Options o = RankOptions(r, 2);
        o.peer_timeout_s = 1.0;
        return o;
      },
      [&](int rank, Engine& engine) {
        int32_t x = rank + 1;
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        auto h = engine.AllreduceAsync("late", &x, &x, DataType::kInt32, {1}, ReduceOp::kSum);
        ASSERT_TRUE(h.ok());
        if (rank == 0) {
          const auto start = std::chrono::steady_clock::now();
          const Status early = engine.Wait(*h, std::chrono::milliseconds(1200));
          const auto took = std::chrono::steady_clock::now() - start;
          EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early.ToString();
          // Named with the timeout given, not what was left of it.
          EXPECT_NE(early.message().find("within 1200 ms"), std::string::npos) << early.ToString();
          // Bounded by the timeout, not by the peer's submission 2.5 s in.
          EXPECT_LT(took, std::chrono::milliseconds(2200));
          // It drove: the exchange it started pulled the idle peer in.
          EXPECT_GT(engine.stats().caller_cycles, 0);
        }
        ASSERT_TRUE(engine.Wait(*h).ok());
        EXPECT_EQ(x, 3);
      });
}

// Ranks with nothing new sleep until a peer or a submission wakes them: no cycles while idle.
TEST(Engine, IdleRanksRunNoCycles) {
  // The ranks are threads of this process; `sync` keeps any rank from submitting "after" (which
  // starts an exchange every rank joins) while another is still watching its idle count.
  std::barrier sync(3);
  RunRanks(3, [&](int rank, Engine& engine) {
    int32_t x = 1;
    auto warm = engine.AllreduceAsync("warm", &x, &x, DataType::kInt32, {1}, ReduceOp::kSum);
    ASSERT_TRUE(warm.ok());
    ASSERT_TRUE(engine.Wait(*warm).ok());
    // The cycle that completed "warm" counts itself just after completing it, and a loaded
    // machine may deschedule a rank's thread for a while: wait (bounded) until the count has held
    // for 100 ms. A rank that cycled while idle would never get there.
    int64_t settled = engine.stats().cycles;
    for (int i = 0; i < 20; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t now = engine.stats().cycles;
      if (now == settled) break;
      settled = now;
    }
    sync.arrive_and_wait();
    const int64_t before = engine.stats().cycles;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(engine.stats().cycles, before) << "rank " << rank << " ran cycles while idle";
    sync.arrive_and_wait();
    // And it still answers at once afterwards.
    int32_t y = rank;
    auto after = engine.AllreduceAsync("after", &y, &y, DataType::kInt32, {1}, ReduceOp::kSum);
    ASSERT_TRUE(after.ok());
    ASSERT_TRUE(engine.Wait(*after).ok());
    EXPECT_EQ(y, 0 + 1 + 2);
  });
}

// With 3 ranks, rank 2 folds its bits into rank 0's in the bit-vector exchange. Ranks 0 and 1
// submit at once and start exchanges; rank 2 submits only after more than the peer timeout. An
// idle rank must be pulled into every exchange a peer starts, or rank 0 would wait for rank 2's
// fold until the timeout fails the job.
TEST(Engine, AnIdleFoldingRankIsPulledIntoExchanges) {
  RunRanks(
      3,
      [](int r) {
        Options o = RankOptions(r, 3);
        o.peer_timeout_s = 0.5;
        return o;
      },
      [](int rank, Engine& engine) {
        if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
        int32_t x = rank + 1;
        auto h = engine.AllreduceAsync("late", &x, &x, DataType::kInt32, {1}, ReduceOp::kSum);
        ASSERT_TRUE(h.ok());
        Status s = engine.Wait(*h, std::chrono::seconds(10));
        ASSERT_TRUE(s.ok()) << "rank " << rank << ": " << s.ToString();
        EXPECT_EQ(x, 1 + 2 + 3);
      });
}

// The scheduling policies (field 41 of /proc/self/task/TID/stat) of this process's threads.
std::multiset<int> ThreadPolicies() {
  std::multiset<int> policies;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));  // from field 3 on
    std::string field;
    for (int i = 3; i <= 41 && fields >> field; ++i) {
      if (i == 41) policies.insert(std::stoi(field));
    }
  }
  return policies;
}

TEST(Engine, TheBackgroundThreadRunsAsBatchWhenAsked) {
  for (const std::string policy : {"batch", "normal"}) {
    std::barrier sync(2);
    std::vector<size_t> batch_threads(2);
    RunRanks(
        2,
        [&](int r) {
          Options o = RankOptions(r, 2);
          o.engine_sched = policy;
          return o;
        },
        [&](int rank, Engine& engine) {
          int32_t x = 1;
          auto h = engine.AllreduceAsync("x", &x, &x, DataType::kInt32, {1}, ReduceOp::kSum);
          ASSERT_TRUE(h.ok());
          ASSERT_TRUE(engine.Wait(*h).ok());
          sync.arrive_and_wait();
          // A waiting caller may have driven that allreduce itself (and has its own policy back):
          // the background threads may still be starting. Wait for them (bounded).
          size_t n = ThreadPolicies().count(SCHED_BATCH);
          for (int i = 0; policy == "batch" && n < 2 && i < 250; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            n = ThreadPolicies().count(SCHED_BATCH);
          }
          batch_threads[static_cast<size_t>(rank)] = n;
          sync.arrive_and_wait();
        });
    // Both ranks' engine threads (and no other thread of the test) under "batch"; none otherwise.
    for (size_t n : batch_threads) EXPECT_EQ(n, policy == "batch" ? 2u : 0u) << policy;
  }
}

// Ranks run as threads in one process: each engine thread's log lines name its own rank.
TEST(Engine, EachRanksBackgroundThreadLogsItsOwnRank) {
  const LogLevel level = GetLogLevel();
  ::testing::internal::CaptureStderr();
  RunRanks(
      2,
      [&](int r) {
        Options o = RankOptions(r, 2);
        o.engine_sched = "batch";  // the thread logs a debug line when it starts
        o.log_level = LogLevel::kDebug;
        return o;
      },
      [&](int /*rank*/, Engine& engine) {
        int32_t x = 1;
        auto h = engine.AllreduceAsync("x", &x, &x, DataType::kInt32, {1}, ReduceOp::kSum);
        ASSERT_TRUE(h.ok());
        ASSERT_TRUE(engine.Wait(*h).ok());
      });
  const std::string out = ::testing::internal::GetCapturedStderr();
  SetLogLevel(level);
  SetLogRank(-1);
  for (int r : {0, 1}) {
    EXPECT_NE(out.find(fmt::format(" rank {}] engine thread runs as SCHED_BATCH", r)),
              std::string::npos)
        << "rank " << r << "'s engine thread line is missing or names another rank:\n"
        << out;
  }
}

TEST(Engine, FusionWithMixedDtypesFusesAndStaysCorrect) {
  RunRanks(2, [](int rank, Engine& engine) {
    const std::vector<DataType> dtypes = AllDataTypes();
    const int per_dtype = 10;
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<std::pair<Handle, DataType>> hs;
    for (int k = 0; k < per_dtype; ++k) {
      for (DataType d : dtypes) {
        const size_t count = 50 + static_cast<size_t>(k);
        bufs.push_back(MakeInput(d, count, rank));
        auto h = engine.AllreduceAsync(fmt::format("{}.{}", DataTypeName(d), k), bufs.back().data(),
                                       bufs.back().data(), d, {static_cast<int64_t>(count)},
                                       ReduceOp::kSum);
        ASSERT_TRUE(h.ok());
        hs.emplace_back(*h, d);
      }
    }
    for (size_t j = 0; j < hs.size(); ++j) {
      ASSERT_TRUE(engine.Wait(hs[j].first).ok());
      const size_t count = 50 + j / dtypes.size();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(LoadElement(hs[j].second, bufs[j].data(), i), ExpectedSum(2, i)) << j;
      }
    }
    const auto stats = engine.stats();
    EXPECT_EQ(stats.tensors, static_cast<int64_t>(hs.size()));
    EXPECT_LT(stats.collectives, stats.tensors) << "small tensors should have been fused";
    EXPECT_GT(stats.fused_bytes, 0);
  });
}

// The counters the time breakdown reads (kolo-train's comm_ms and comm_bytes_per_step) are up to
// date as soon as a Wait returns: an allreduce's payload, the ring's bytes on the wire (2(N-1)/N
// of the payload, plus the negotiation's few bytes) and the time it took.
TEST(Engine, CommunicationCountersAreCurrentWhenWaitReturns) {
  RunRanks(3, [](int rank, Engine& engine) {
    constexpr int64_t kCount = 3 * 100000;  // floats, a multiple of the ring's 3 segments
    constexpr int64_t kBytes = kCount * 4;
    std::vector<float> x(kCount, static_cast<float>(rank));
    const Engine::Stats before = engine.stats();
    auto h = engine.AllreduceAsync("big", x.data(), x.data(), DataType::kFloat32, {kCount},
                                   ReduceOp::kSum);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(engine.Wait(*h).ok());
    const Engine::Stats after = engine.stats();
    ASSERT_EQ(x[0], 0.0f + 1 + 2);
    EXPECT_EQ(after.allreduce_bytes - before.allreduce_bytes, kBytes);
    const int64_t ring = 2 * (3 - 1) * kBytes / 3;
    const int64_t sent = after.transport_bytes_sent - before.transport_bytes_sent;
    EXPECT_GE(sent, ring);
    EXPECT_LT(sent, ring + 4096) << "only negotiation may add to the ring's bytes";
    EXPECT_GE(after.transport_bytes_received - before.transport_bytes_received, ring);
    EXPECT_GT(after.execute_us, before.execute_us);
    // A broadcast moves bytes but is no allreduce.
    int32_t y = rank == 0 ? 7 : 0;
    auto b = engine.BroadcastAsync("b", &y, DataType::kInt32, {1}, /*root=*/0);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE(engine.Wait(*b).ok());
    EXPECT_EQ(y, 7);
    EXPECT_EQ(engine.stats().allreduce_bytes, after.allreduce_bytes);
  });
}

TEST(Engine, FusionKeepsLargeTensorsInPlaceAndPacksSmallOnes) {
  RunRanks(3, [](int rank, Engine& engine) {
    // Large (>= 128 KiB, reduced where they are) and small (packed) tensors in one group, out of
    // place and in place, averaged.
    const std::vector<size_t> counts = {100000, 10, 65536, 3, 40000, 250000, 1};
    std::vector<std::vector<double>> in(counts.size()), out(counts.size());
    std::vector<Handle> hs;
    for (size_t k = 0; k < counts.size(); ++k) {
      in[k].resize(counts[k]);
      for (size_t i = 0; i < counts[k]; ++i) in[k][i] = static_cast<double>(rank * 3 + i % 11);
      out[k].assign(counts[k], -1);
      const bool in_place = k % 2 == 0;
      if (in_place) out[k] = in[k];
      hs.push_back(*engine.AllreduceAsync(
          fmt::format("m{}", k), in_place ? out[k].data() : in[k].data(), out[k].data(),
          DataType::kFloat64, {static_cast<int64_t>(counts[k])}, ReduceOp::kAverage));
    }
    for (auto h : hs) ASSERT_TRUE(engine.Wait(h).ok());
    for (size_t k = 0; k < counts.size(); ++k) {
      for (size_t i = 0; i < counts[k]; ++i) {
        ASSERT_EQ(out[k][i], 3.0 + i % 11) << k << " " << i;
      }
      if (k % 2 == 1 && counts[k] > 0) {
        EXPECT_EQ(in[k][0], rank * 3.0) << "input changed";
      }
    }
    const auto s = engine.stats();
    EXPECT_GT(s.fused_bytes, s.packed_bytes) << "large tensors should not be copied";
    EXPECT_GT(s.packed_bytes, 0) << "small tensors should be packed";
  });
}

TEST(Engine, FusionThresholdZeroRunsEachTensorAlone) {
  RunRanks(
      2,
      [](int r) {
        auto o = RankOptions(r, 2);
        o.fusion_threshold_bytes = 0;
        return o;
      },
      [](int, Engine& engine) {
        std::vector<std::vector<float>> bufs(12, std::vector<float>(64, 1.0f));
        std::vector<Handle> hs;
        for (size_t i = 0; i < bufs.size(); ++i) {
          hs.push_back(*engine.AllreduceAsync(fmt::format("u{}", i), bufs[i].data(), bufs[i].data(),
                                              DataType::kFloat32, {64}, ReduceOp::kSum));
        }
        for (auto h : hs) ASSERT_TRUE(engine.Wait(h).ok());
        EXPECT_EQ(engine.stats().collectives, 12);
        EXPECT_EQ(engine.stats().fused_bytes, 0);
        EXPECT_EQ(bufs[5][10], 2.0f);
      });
}

TEST(Engine, BroadcastFromEveryRoot) {
  const int size = 4;
  RunRanks(size, [&](int rank, Engine& engine) {
    for (int root = 0; root < size; ++root) {
      std::vector<int64_t> data(333 + root, rank == root ? 1000 + root : -1);
      auto h = engine.BroadcastAsync(fmt::format("b{}", root), data.data(), DataType::kInt64,
                                     {static_cast<int64_t>(data.size())}, root);
      ASSERT_TRUE(h.ok());
      ASSERT_TRUE(engine.Wait(*h).ok());
      for (int64_t v : data) ASSERT_EQ(v, 1000 + root) << "root " << root << " rank " << rank;
    }
  });
}

TEST(Engine, AllgatherWithUnevenFirstDimensions) {
  const int size = 4;
  RunRanks(size, [&](int rank, Engine& engine) {
    const int64_t rows = rank == 2 ? 0 : rank + 1;  // 1, 2, 0, 4
    std::vector<float> in(static_cast<size_t>(rows * 3));
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(rank * 100 + i);
    auto h = engine.AllgatherAsync("ag", in.data(), DataType::kFloat32, {rows, 3});
    ASSERT_TRUE(h.ok());
    auto g = engine.TakeGathered(*h);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->shape, (Shape{7, 3}));
    EXPECT_EQ(g->first_dims, (std::vector<int64_t>{1, 2, 0, 4}));
    const float* out = reinterpret_cast<const float*>(g->data.data());
    size_t k = 0;
    for (int r = 0; r < size; ++r) {
      const int64_t rr = r == 2 ? 0 : r + 1;
      for (int64_t i = 0; i < rr * 3; ++i) ASSERT_EQ(out[k++], static_cast<float>(r * 100 + i));
    }
  });
}

TEST(Engine, MismatchedShapesFailOnEveryRankNamingBoth) {
  RunRanks(3, [](int rank, Engine& engine) {
    std::vector<float> buf(64 * 3 * 7 * 7);
    const Shape shape = rank == 1 ? Shape{64, 3, 3, 3} : Shape{64, 3, 7, 7};
    auto h = engine.AllreduceAsync("conv1/weight", buf.data(), buf.data(), DataType::kFloat32,
                                   shape, ReduceOp::kSum);
    ASSERT_TRUE(h.ok());
    Status s = engine.Wait(*h);
    ASSERT_FALSE(s.ok()) << "rank " << rank;
    EXPECT_NE(s.message().find("conv1/weight"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("[64,3,3,3]"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("[64,3,7,7]"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
    // The engine stays usable after a mismatch.
    std::vector<float> ok(10, 1.0f);
    auto h2 = engine.AllreduceAsync("after", ok.data(), ok.data(), DataType::kFloat32, {10},
                                    ReduceOp::kSum);
    ASSERT_TRUE(h2.ok());
    EXPECT_TRUE(engine.Wait(*h2).ok());
    EXPECT_EQ(ok[0], 3.0f);
  });
}

TEST(Engine, MismatchedDtypeAndRootAreErrors) {
  RunRanks(2, [](int rank, Engine& engine) {
    std::vector<double> buf(8);
    auto h = engine.AllreduceAsync("d", buf.data(), buf.data(),
                                   rank == 0 ? DataType::kFloat32 : DataType::kFloat64, {8},
                                   ReduceOp::kSum);
    Status s = engine.Wait(*h);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("float64"), std::string::npos) << s.ToString();
    auto b = engine.BroadcastAsync("r", buf.data(), DataType::kFloat64, {8}, rank);
    Status sb = engine.Wait(*b);
    EXPECT_FALSE(sb.ok());
    EXPECT_NE(sb.message().find("root"), std::string::npos) << sb.ToString();
  });
}

TEST(Engine, DuplicateInFlightNameIsRejected) {
  RunRanks(2, [](int rank, Engine& engine) {
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    auto h1 =
        engine.AllreduceAsync("dup", a.data(), a.data(), DataType::kFloat32, {4}, ReduceOp::kSum);
    ASSERT_TRUE(h1.ok());
    if (rank == 0) {
      auto h2 =
          engine.AllreduceAsync("dup", b.data(), b.data(), DataType::kFloat32, {4}, ReduceOp::kSum);
      ASSERT_FALSE(h2.ok());
      EXPECT_NE(h2.status().message().find("already in flight"), std::string::npos);
    }
    EXPECT_TRUE(engine.Wait(*h1).ok());
    // Once done, the name may be used again.
    auto h3 =
        engine.AllreduceAsync("dup", b.data(), b.data(), DataType::kFloat32, {4}, ReduceOp::kSum);
    ASSERT_TRUE(h3.ok());
    EXPECT_TRUE(engine.Wait(*h3).ok());
  });
}

TEST(Engine, SteadyStateStepsHitTheResponseCache) {
  RunRanks(4, [](int, Engine& engine) {
    std::vector<std::vector<float>> bufs(20, std::vector<float>(256));
    for (int step = 0; step < 6; ++step) {
      std::vector<Handle> hs;
      for (size_t i = 0; i < bufs.size(); ++i) {
        std::fill(bufs[i].begin(), bufs[i].end(), 1.0f);
        hs.push_back(*engine.AllreduceAsync(fmt::format("w{}", i), bufs[i].data(), bufs[i].data(),
                                            DataType::kFloat32, {256}, ReduceOp::kSum));
      }
      for (auto h : hs) ASSERT_TRUE(engine.Wait(h).ok());
      for (auto& b : bufs) ASSERT_EQ(b[7], 4.0f);
    }
    const auto s = engine.stats();
    // The first step negotiates through rank 0; later steps agree through the cache.
    EXPECT_GE(s.cache_hits, 5 * 20);
  });
}

TEST(Engine, CacheEntryWithChangedShapeIsRenegotiated) {
  RunRanks(3, [](int rank, Engine& engine) {
    for (int step = 0; step < 4; ++step) {
      // Step 2 changes the tensor's shape on every rank; step 3 only on rank 1 (an error).
      int64_t n = step >= 2 ? 32 : 16;
      if (step == 3 && rank == 1) n = 48;
      std::vector<float> buf(48, 1.0f);
      auto h = engine.AllreduceAsync("v", buf.data(), buf.data(), DataType::kFloat32, {n},
                                     ReduceOp::kSum);
      ASSERT_TRUE(h.ok());
      Status s = engine.Wait(*h);
      if (step < 3) {
        ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.ToString();
        EXPECT_EQ(buf[n - 1], 3.0f);
        EXPECT_EQ(buf[n], 1.0f);
      } else {
        EXPECT_FALSE(s.ok());
        EXPECT_NE(s.message().find("[48]"), std::string::npos) << s.ToString();
      }
    }
  });
}

TEST(Engine, CacheCapacitySmallerThanAStepStillWorks) {
  RunRanks(
      2,
      [](int r) {
        auto o = RankOptions(r, 2);
        o.cache_capacity = 3;
        return o;
      },
      [](int, Engine& engine) {
        for (int step = 0; step < 4; ++step) {
          std::vector<std::vector<int32_t>> bufs(10, std::vector<int32_t>(5, 1));
          std::vector<Handle> hs;
          for (size_t i = 0; i < bufs.size(); ++i) {
            hs.push_back(*engine.AllreduceAsync(fmt::format("c{}", i), bufs[i].data(),
                                                bufs[i].data(), DataType::kInt32, {5},
                                                ReduceOp::kSum));
          }
          for (auto h : hs) ASSERT_TRUE(engine.Wait(h).ok());
          for (auto& b : bufs) ASSERT_EQ(b[0], 2);
        }
      });
}

// Three ranks that warn about a stall after 0.5 s and fail it after 1.5 s.
Options StallOptions(int rank) {
  auto o = RankOptions(rank, 3);
  o.stall_warning_s = 0.5;
  o.stall_shutdown_s = 1.5;
  return o;
}

// The error every rank that submitted gets when rank 2 never does.
void ExpectStalledWithoutRank2(const Status& s) {
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("stalled"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("never by ranks 2"), std::string::npos) << s.ToString();
}

TEST(Engine, StalledTensorFailsAfterShutdownTimeNamingMissingRanks) {
  RunRanks(
      3, StallOptions,
      [](int rank, Engine& engine) {
        std::vector<float> buf(8, 1.0f);
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::seconds(3));
          return;  // rank 2 never submits "lonely"
        }
        auto h = engine.AllreduceAsync("lonely", buf.data(), buf.data(), DataType::kFloat32, {8},
                                       ReduceOp::kSum);
        ASSERT_TRUE(h.ok());
        ExpectStalledWithoutRank2(engine.Wait(*h, std::chrono::seconds(20)));
      },
      /*clean_shutdown=*/false);
}

// In steady state a tensor is a response-cache hit, agreed by the bit exchange alone, which says
// only "not ready everywhere". When one rank stops submitting it, the ranks waiting on the hit must
// hand it back to the coordinator so that the stall is still reported and, with a shutdown time,
// fails naming the rank that is missing.
TEST(Engine, StalledCacheHitFailsAfterShutdownTimeNamingMissingRanks) {
  RunRanks(
      3, StallOptions,
      [](int rank, Engine& engine) {
        std::vector<float> buf(8, 1.0f);
        for (int step = 0; step < 3; ++step) {
          auto h = engine.AllreduceAsync("steady", buf.data(), buf.data(), DataType::kFloat32, {8},
                                         ReduceOp::kSum);
          ASSERT_TRUE(h.ok());
          ASSERT_TRUE(engine.Wait(*h).ok());
        }
        ASSERT_GE(engine.stats().cache_hits, 2) << "rank " << rank << ": 'steady' is not cached";
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return;  // rank 2 stops submitting "steady"
        }
        const auto start = std::chrono::steady_clock::now();
        auto h = engine.AllreduceAsync("steady", buf.data(), buf.data(), DataType::kFloat32, {8},
                                       ReduceOp::kSum);
        ASSERT_TRUE(h.ok());
        ExpectStalledWithoutRank2(engine.Wait(*h, std::chrono::seconds(20)));
        // Failed by the stall shutdown (1.5 s), not by rank 2's shutdown at 4 s.
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(3500));
      },
      /*clean_shutdown=*/false);
}

// One mechanism for every setting that must match, the engine's and the application's: a rank
// with another value fails at start-up on every rank, naming the setting, the values and the
// ranks that hold each.
TEST(Engine, SettingsThatMustAgreeAreChecked) {
  constexpr int kRanks = 4;
  bootstrap::InMemoryStore store;
  std::vector<std::thread> threads;
  std::vector<Status> results(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto o = RankOptions(r, kRanks);
      o.fusion_threshold_bytes = r == 1 ? (32 << 20) : (64 << 20);
      o.app_settings = {{"model", "resnet101"}, {"num_batches", r == 2 ? "3" : "40"}};
      auto e = Engine::Create(o, &store);
      results[r] = e.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_EQ(results[r].code(), StatusCode::kInvalidArgument) << results[r].ToString();
    const std::string m = results[r].message();
    EXPECT_NE(m.find("fusion_threshold_bytes is '33554432' on rank 1, '67108864' on ranks 0,2,3"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("num_batches is '3' on rank 2, '40' on ranks 0,1,3"), std::string::npos) << m;
    EXPECT_EQ(m.find("model"), std::string::npos) << "model matches: " << m;
  }
}

TEST(Engine, MatchingApplicationSettingsPass) {
  RunRanks(
      3,
      [](int r) {
        auto o = RankOptions(r, 3);
        o.app_settings = {{"model", "vgg16"}, {"num_batches", "5"}};
        return o;
      },
      [](int, Engine&) {});
}

TEST(Engine, ShutdownFailsLaterSubmissions) {
  RunRanks(2, [](int, Engine& engine) {
    ASSERT_TRUE(engine.Barrier().ok());
    ASSERT_TRUE(engine.Shutdown().ok());
    std::vector<float> buf(4);
    auto h = engine.AllreduceAsync("late", buf.data(), buf.data(), DataType::kFloat32, {4},
                                   ReduceOp::kSum);
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.status().message().find("shut down"), std::string::npos);
  });
}

TEST(Engine, ShutdownFromSeveralThreadsAtOnceJoinsOnce) {
  // Threads that shut the engine down together (a signal handler's thread and the main one, say)
  // each return OK once the background thread has stopped; none joins it a second time.
  RunRanks(2, [](int, Engine& engine) {
    ASSERT_TRUE(engine.Barrier().ok());
    std::vector<Status> results(4);
    std::barrier start(static_cast<std::ptrdiff_t>(results.size()));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < results.size(); ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        results[i] = engine.Shutdown();
      });
    }
    for (auto& t : threads) t.join();
    for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
    std::vector<float> buf(4);
    EXPECT_FALSE(
        engine
            .AllreduceAsync("late", buf.data(), buf.data(), DataType::kFloat32, {4}, ReduceOp::kSum)
            .ok());
  });
}

TEST(Engine, TwoThreadsWaitingOnOneHandleGetItOnceAndAnErrorOnce) {
  // Rank 0 waits on a pending allreduce from two threads; rank 1 submits its part later. One
  // waiter gets the result, the other an error naming the handle; neither crashes nor hangs.
  RunRanks(2, [](int rank, Engine& engine) {
    std::vector<float> buf(4, 1.0f);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto h = engine.AllreduceAsync("shared", buf.data(), buf.data(), DataType::kFloat32, {4},
                                   ReduceOp::kSum);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    if (rank == 1) {
      EXPECT_TRUE(engine.Wait(*h).ok());
      return;
    }
    std::vector<Status> results(2);
    std::barrier start(2);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < results.size(); ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        results[i] = engine.Wait(*h, std::chrono::seconds(30));
      });
    }
    for (auto& t : threads) t.join();
    const int ok = static_cast<int>(results[0].ok()) + static_cast<int>(results[1].ok());
    EXPECT_EQ(ok, 1) << results[0].ToString() << " / " << results[1].ToString();
    const Status& other = results[0].ok() ? results[1] : results[0];
    EXPECT_NE(other.message().find("handle"), std::string::npos) << other.ToString();
    EXPECT_EQ(buf[0], 2.0f);
  });
}

TEST(Engine, BadArgumentsAreRejectedAtSubmission) {
  RunRanks(1, [](int, Engine& engine) {
    float x = 0;
    EXPECT_FALSE(engine.BroadcastAsync("b", &x, DataType::kFloat32, {1}, 3).ok());
    EXPECT_FALSE(engine.AllreduceAsync("", &x, &x, DataType::kFloat32, {1}, ReduceOp::kSum).ok());
    EXPECT_FALSE(engine.AllreduceAsync("n", &x, &x, DataType::kFloat32, {-1}, ReduceOp::kSum).ok());
    EXPECT_FALSE(engine.AllgatherAsync("s", &x, DataType::kFloat32, {}).ok());
    EXPECT_FALSE(engine.Wait(Handle{12345}).ok());
  });
}

TEST(Engine, TimelineHoldsEveryPhaseOnEveryRank) {
  // The one-shot's host area is opened through /proc/<pid>/fd.
  const bool area = ::access("/proc/self/fd", R_OK) == 0;
  const std::string base = ::testing::TempDir() + "/kolo_timeline_test.json";
  RunRanks(
      2,
      [&](int r) {
        auto o = RankOptions(r, 2);
        o.timeline_path = base;
        // The ring's phases first; then, retuned, the one-shot's through the host area.
        o.allreduce_algorithm = "ring";
        return o;
      },
      [area](int rank, Engine& engine) {
        std::vector<std::vector<float>> bufs(4, std::vector<float>(4096, 1.0f));
        std::vector<Handle> hs;
        for (size_t i = 0; i < bufs.size(); ++i) {
          hs.push_back(*engine.AllreduceAsync(fmt::format("layer{}/w", i), bufs[i].data(),
                                              bufs[i].data(), DataType::kFloat32, {4096},
                                              ReduceOp::kAverage));
        }
        for (auto h : hs) ASSERT_TRUE(engine.Wait(h).ok());
        std::vector<float> b(10, static_cast<float>(rank));
        ASSERT_TRUE(
            engine.Wait(*engine.BroadcastAsync("bc", b.data(), DataType::kFloat32, {10}, 0)).ok());
        if (!area) return;
        Engine::Tunables t = engine.tunables();
        t.allreduce_algorithm = "one-shot";
        ASSERT_TRUE(engine.Retune("to-one-shot", t).ok());
        std::vector<float> small(100, 2.0f);
        ASSERT_TRUE(engine
                        .Wait(*engine.AllreduceAsync("small", small.data(), small.data(),
                                                     DataType::kFloat32, {100}, ReduceOp::kSum))
                        .ok());
        EXPECT_EQ(small[99], 4.0f);
      });
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path =
        rank == 0 ? base : ::testing::TempDir() + "/kolo_timeline_test.rank1.json";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    const auto trace = nlohmann::json::parse(in);
    std::set<std::string> names;
    for (const auto& ev : trace["traceEvents"]) {
      if (ev.contains("name")) names.insert(ev["name"].get<std::string>());
      if (ev.value("ph", "") != "M") {
        EXPECT_EQ(ev["pid"].get<int>(), rank);
      }
    }
    for (const char* phase :
         {"QUEUE", "NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "RING_ALLREDUCE",
          "REDUCE_SCATTER", "ALLGATHER", "MEMCPY_OUT_FUSION_BUFFER", "NEGOTIATE_BROADCAST",
          "BROADCAST", area ? "ONE_SHOT" : "BROADCAST"}) {
      EXPECT_TRUE(names.count(phase)) << phase << " missing from " << path;
    }
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace kolo
