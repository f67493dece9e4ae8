// Several TCP streams per pair (Options::tcp_streams) through the engine and the transport: the
// collectives stay exact with messages striped across the streams, a pair takes the connecting
// rank's count when the two ends were given different ones, ranks that disagree on the setting
// stop at start-up naming them, and bad values are refused naming what is allowed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/options.h"
#include "engine/engine.h"
#include "engine/transport/registry.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/rank_threads.h"
#include "tests/engine/transport_test_util.h"

namespace kolo {
namespace {

using testing::RankOptions;
using testing::RunRanks;

// 4 ranks over TCP with 3 streams per pair and every message of 4 KiB or more striped: the ring's
// allreduces of many sizes (the reduce-scatter combines striped parts as they arrive), summed and
// averaged, float32 and float64, and a broadcast, all exact.
TEST(TcpStreams, CollectivesAreExactWithStripedMessages) {
  constexpr int kRanks = 4;
  RunRanks(
      kRanks,
      [](int r) {
        Options o = RankOptions(r, kRanks);
        o.transport = "tcp";
        o.tcp_streams = 3;
        o.tcp_stripe_min_bytes = 4096;
        o.allreduce_algorithm = "ring";
        o.ring_chunk_bytes = 64 << 10;
        return o;
      },
      [](int rank, Engine& engine) {
        EXPECT_EQ(engine.stats().tcp_streams, 3);
        for (size_t count :
             {size_t{1}, size_t{1000}, size_t{4097}, size_t{300001}, size_t{1} << 21}) {
          std::vector<float> f(count);
          std::vector<double> d(count);
          for (size_t i = 0; i < count; ++i) {
            f[i] = static_cast<float>(testing::InputValue(rank, i));
            d[i] = testing::InputValue(rank, i);
          }
          auto h1 = engine.AllreduceAsync(fmt::format("f{}", count), f.data(), f.data(),
                                          DataType::kFloat32, {static_cast<int64_t>(count)},
                                          ReduceOp::kSum);
          auto h2 = engine.AllreduceAsync(fmt::format("d{}", count), d.data(), d.data(),
                                          DataType::kFloat64, {static_cast<int64_t>(count)},
                                          ReduceOp::kAverage);
          ASSERT_TRUE(h1.ok() && h2.ok());
          ASSERT_TRUE(engine.Wait(*h1).ok());
          ASSERT_TRUE(engine.Wait(*h2).ok());
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) {
            wrong += f[i] != static_cast<float>(testing::ExpectedSum(kRanks, i));
            wrong += d[i] != testing::ExpectedSum(kRanks, i) / kRanks;
          }
          EXPECT_EQ(wrong, 0u) << "rank " << rank << ", " << count << " elements";
        }
        std::vector<int64_t> b(100000, rank == 2 ? 7 : 0);
        auto h = engine.BroadcastAsync("b", b.data(), DataType::kInt64, {100000}, 2);
        ASSERT_TRUE(h.ok());
        ASSERT_TRUE(engine.Wait(*h).ok());
        for (int64_t v : b) ASSERT_EQ(v, 7);
      });
}

// Rank 1 connects to rank 0 with 3 streams while rank 0 would open 1: the pair is the
// connector's, 3 streams on both ends, and a striped message arrives whole.
TEST(TcpStreams, APairTakesTheConnectorsCount) {
  bootstrap::InMemoryStore store;
  const transport::ConnectSettings settings = testing::TestSettings();  // one job secret
  testing::Devices d = testing::ConnectAll("tcp", 2, store, [&](int r) {
    transport::ConnectSettings s = settings;
    s.tcp_streams = r == 0 ? 1 : 3;
    s.tcp_stripe_min_bytes = 4096;
    return s;
  });
  ASSERT_TRUE(d[0] && d[1]);
  EXPECT_EQ(d[0]->transport_memory_bytes(), d[1]->transport_memory_bytes());
  const std::vector<uint8_t> message = testing::Pattern(1 << 20, 5);
  std::vector<uint8_t> got(1 << 20, 0);
  auto statuses = testing::RunRankThreads(2, [&](int r) -> Status {
    std::vector<transport::Completion> done;
    if (r == 1) {
      KOLO_ASSIGN_OR_RETURN(auto a,
                            d[1]->Register(const_cast<uint8_t*>(message.data()), message.size()));
      KOLO_RETURN_IF_ERROR(d[1]->pair(0).Send(*a, 0, message.size(), 9));
      while (done.empty()) KOLO_RETURN_IF_ERROR(d[1]->Poll(&done, std::chrono::seconds(20)));
      return Status::OK();
    }
    KOLO_ASSIGN_OR_RETURN(auto b, d[0]->Register(got.data(), got.size()));
    KOLO_RETURN_IF_ERROR(d[0]->pair(1).Recv(*b, 0, got.size(), 9));
    while (done.empty()) KOLO_RETURN_IF_ERROR(d[0]->Poll(&done, std::chrono::seconds(20)));
    return Status::OK();
  });
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].ToString();
  EXPECT_TRUE(statuses[1].ok()) << statuses[1].ToString();
  EXPECT_TRUE(got == message);
}

TEST(TcpStreams, RanksThatDisagreeFailAtStartUpNamingThem) {
  constexpr int kRanks = 3;
  const std::vector<Status> results = testing::CreateStatuses(kRanks, [](int r) {
    auto o = RankOptions(r, kRanks);
    o.transport = "tcp";
    o.tcp_streams = r == 1 ? 4 : 2;
    return o;
  });
  for (int r = 0; r < kRanks; ++r) {
    const Status& s = results[static_cast<size_t>(r)];
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << s.ToString();
    EXPECT_NE(s.message().find("tcp_streams is '2' on ranks 0,2, '4' on rank 1"), std::string::npos)
        << s.ToString();
  }
}

TEST(TcpStreams, ValuesAreParsedAndBadOnesRefusedNamingTheAllowed) {
  auto env = [](const std::string& v) { return OptionsFromEnvironment({{"KOLO_TCP_STREAMS", v}}); };
  EXPECT_EQ(env("auto")->tcp_streams, 0);
  EXPECT_EQ(env("16")->tcp_streams, 16);
  for (const char* bad : {"0", "17", "-1", "two", "4x"}) {
    auto o = env(bad);
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("allowed are auto or a number of streams from 1 to 16"),
              std::string::npos)
        << o.status().ToString();
  }
  EXPECT_FALSE(env("").ok()) << "set to nothing: a mistake, not the default";
  EXPECT_EQ(TcpStreamsName(0), "auto");
  EXPECT_EQ(TcpStreamsName(3), "3");
  // Loopback, and an address of no interface: one stream.
  EXPECT_EQ(AutoTcpStreams("127.0.0.1"), 1);
  EXPECT_EQ(AutoTcpStreams("192.0.2.77"), 1);
  auto cap = OptionsFromEnvironment({{"KOLO_EMULATED_FLOW_CAP", "250mbit"}});
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ(cap->emulated_flow_cap_bits_per_s, 250e6);
  EXPECT_FALSE(OptionsFromEnvironment({{"KOLO_EMULATED_FLOW_CAP", "fast"}}).ok());
}

}  // namespace
}  // namespace kolo
