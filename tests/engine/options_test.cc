#include "engine/common/options.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace kolo {
namespace {

using Env = std::map<std::string, std::string>;

TEST(Options, DefaultsFollowHorovod) {
  auto o = OptionsFromEnvironment(Env{});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->fusion_threshold_bytes, 64ll << 20);
  EXPECT_EQ(o->cycle_time_ms, 1.0);
  EXPECT_EQ(o->cache_capacity, 1024);
  EXPECT_EQ(o->stall_warning_s, 60.0);
  EXPECT_EQ(o->stall_shutdown_s, 300.0);  // a job out of step ends (Horovod's default: never)
  EXPECT_EQ(o->peer_timeout_s, 30.0);
  EXPECT_EQ(o->size, 1);
  EXPECT_EQ(o->backend, "ring");
  EXPECT_FALSE(o->busy_poll);
}

TEST(Options, OpenMpiEnvironmentWinsOverKolos) {
  auto o = OptionsFromEnvironment(Env{{"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_RANK", "3"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                      {"KOLO_SIZE", "9"},
                                      {"KOLO_RANK", "8"}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->launched_by_mpirun);
  EXPECT_EQ(o->size, 4);
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->local_size, 2);
  EXPECT_EQ(o->local_rank, 1);
}

TEST(Options, KoloLaunchVariables) {
  auto o = OptionsFromEnvironment(Env{{"KOLO_SIZE", "3"},
                                      {"KOLO_RANK", "2"},
                                      {"KOLO_STORE_ADDR", "127.0.0.1:5000"},
                                      {"KOLO_JOB_SECRET", "00112233445566778899aabb"},
                                      {"KOLO_FUSION_THRESHOLD_BYTES", "0"},
                                      {"KOLO_CYCLE_TIME_MS", "2.5"},
                                      {"KOLO_TIMELINE", "/tmp/t.json"}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->local_size, 3);
  EXPECT_EQ(o->fusion_threshold_bytes, 0);
  EXPECT_EQ(o->cycle_time_ms, 2.5);
  EXPECT_EQ(o->store_addr, "127.0.0.1:5000");
  EXPECT_FALSE(o->launched_by_mpirun);
}

struct BadCase {
  Env env;
  std::string must_mention;
};

class BadOptions : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadOptions, AreRejectedNamingTheValue) {
  auto o = OptionsFromEnvironment(GetParam().env);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find(GetParam().must_mention), std::string::npos)
      << o.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadOptions,
    ::testing::Values(BadCase{{{"KOLO_FUSION_THRESHOLD_BYTES", "64MB"}}, "64MB"},
                      BadCase{{{"KOLO_FUSION_THRESHOLD_BYTES", "-1"}}, "-1"},
                      BadCase{{{"KOLO_CYCLE_TIME_MS", "0"}}, "KOLO_CYCLE_TIME_MS"},
                      BadCase{{{"KOLO_CYCLE_TIME_MS", "fast"}}, "fast"},
                      BadCase{{{"KOLO_CACHE_CAPACITY", "lots"}}, "KOLO_CACHE_CAPACITY"},
                      BadCase{{{"KOLO_BACKEND", "nccl2"}}, "nccl2"},
                      BadCase{{{"KOLO_BUSY_POLL", "maybe"}}, "maybe"},
                      BadCase{{{"KOLO_RIDING_MAX_BYTES", "2000000"}}, "KOLO_RIDING_MAX_BYTES"},
                      BadCase{{{"KOLO_RIDING_MAX_BYTES", "-1"}}, "-1"},
                      BadCase{{{"KOLO_ENGINE_SCHED", "fifo"}}, "fifo"},
                      BadCase{{{"KOLO_CALLER_PROGRESS", "sometimes"}}, "sometimes"},
                      BadCase{{{"KOLO_LOG_LEVEL", "loud"}}, "loud"},
                      BadCase{{{"KOLO_SIZE", "2"}, {"KOLO_RANK", "2"}}, "rank=2"},
                      BadCase{{{"KOLO_SIZE", "0"}}, "KOLO_SIZE"},
                      BadCase{{{"KOLO_JOB_SECRET", "short"}}, "16"},
                      BadCase{{{"KOLO_SIZE", "2"}, {"KOLO_BACKEND", "mpi"}}, "mpirun"},
                      BadCase{{{"KOLO_PEER_TIMEOUT_SECONDS", "nan"}}, "nan"},
                      BadCase{{{"KOLO_FAULT_INJECT", "1:SKEW:send:4"}}, "SKEW at point 'send'"},
                      BadCase{{{"KOLO_FAULT_INJECT", "1:EXIT:mpi:4"}}, "EXIT at point 'mpi'"},
                      BadCase{{{"KOLO_FAULT_INJECT", "1:HUP:step:4"}}, "action 'HUP'"},
                      BadCase{{{"KOLO_FAULT_INJECT", "1:STOP:later:4"}}, "point 'later'"}));

// The one list of settings every rank must share: the engine's, then the application's, and the
// parameter-server layout only where it applies.
TEST(Options, MustMatchListsEngineThenApplicationSettings) {
  Options o;
  o.size = 4;
  o.app_settings = {{"model", "vgg16"}};
  auto names = [](const std::vector<MatchedSetting>& list) {
    std::vector<std::string> out;
    for (const auto& s : list) out.push_back(s.name);
    return out;
  };
  const auto ring = names(MustMatch(o));
  EXPECT_EQ(ring.front(), "size");
  EXPECT_EQ(ring.back(), "model");
  EXPECT_EQ(std::count(ring.begin(), ring.end(), "fusion_threshold_bytes"), 1);
  EXPECT_EQ(std::count(ring.begin(), ring.end(), "riding_max_bytes"), 1);
  EXPECT_EQ(std::count(ring.begin(), ring.end(), "ps_servers"), 0);
  EXPECT_EQ(std::count(ring.begin(), ring.end(), "timeline_path"), 0);
  o.backend = "ps";
  const auto ps = names(MustMatch(o));
  EXPECT_EQ(std::count(ps.begin(), ps.end(), "ps_servers"), 1);
  Options other = o;
  other.fusion_threshold_bytes = 1;
  EXPECT_NE(MustMatch(o), MustMatch(other));
  other = o;
  other.timeline_path = "/tmp/t.json";  // per rank
  other.rank = 3;
  EXPECT_EQ(MustMatch(o), MustMatch(other));
}

TEST(Options, ANumberSetToNothingIsRefusedNotIgnored) {
  auto o = OptionsFromEnvironment(Env{{"KOLO_RING_CHUNK_BYTES", ""}});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(
      o.status().message().find("KOLO_RING_CHUNK_BYTES is set but empty; allowed: an integer"),
      std::string::npos)
      << o.status().message();
  EXPECT_FALSE(OptionsFromEnvironment(Env{{"KOLO_CYCLE_TIME_MS", ""}}).ok());
  // A path or name set to nothing means "none", as before.
  EXPECT_TRUE(OptionsFromEnvironment(Env{{"KOLO_TIMELINE", ""}}).ok());
}

TEST(Options, MisspelledVariablesAreReported) {
  // KOLO_SKIP_BUILD is the scripts' (scripts/sweep passes it on to the ranks it starts).
  const Env env{{"KOLO_FUSION_THRESHOLD", "1"},
                {"KOLO_CYCLE_TIME_MS", "2"},
                {"KOLO_SKIP_BUILD", "1"},
                {"PATH", "/bin"}};
  EXPECT_EQ(UnknownKoloVariables(env), (std::vector<std::string>{"KOLO_FUSION_THRESHOLD"}));
  EXPECT_TRUE(OptionsFromEnvironment(env).ok());
}

TEST(Options, SocketBuffersShrinkWithTheLocalRanksSharingTheCache) {
  constexpr int64_t kL3 = 32ll << 20;
  constexpr int kMany = 64;  // a processor for every rank
  EXPECT_EQ(AutoSocketBufferBytes(1, kL3, kMany), 4 << 20);
  EXPECT_EQ(AutoSocketBufferBytes(2, kL3, kMany), 2 << 20);
  EXPECT_EQ(AutoSocketBufferBytes(4, kL3, kMany), 1 << 20);
  EXPECT_EQ(AutoSocketBufferBytes(8, kL3, kMany), 512 << 10);
  EXPECT_EQ(AutoSocketBufferBytes(64, kL3, kMany), 512 << 10);  // the floor
  EXPECT_EQ(AutoSocketBufferBytes(3, kL3, kMany), 1 << 20);  // a power of two at or below the share
  EXPECT_EQ(AutoSocketBufferBytes(1, 256ll << 20, kMany), 4 << 20);  // the ceiling
  EXPECT_EQ(AutoSocketBufferBytes(4, 0, kMany), 2 << 20);            // cache unknown
  EXPECT_EQ(AutoSocketBufferBytes(0, kL3, kMany), 4 << 20);          // treated as one rank
}

TEST(Options, SocketBuffersShrinkFurtherWhenRanksShareProcessors) {
  constexpr int64_t kL3 = 32ll << 20;
  EXPECT_EQ(AutoSocketBufferBytes(2, kL3, 2), 2 << 20);    // one rank per processor
  EXPECT_EQ(AutoSocketBufferBytes(4, kL3, 2), 512 << 10);  // two: 32 MiB / (8 * 4 * 2)
  EXPECT_EQ(AutoSocketBufferBytes(3, kL3, 2), 512 << 10);  // 32 MiB / (8 * 3 * 2) = 683 KiB
  EXPECT_EQ(AutoSocketBufferBytes(4, 128ll << 20, 2), 2 << 20);
  EXPECT_EQ(AutoSocketBufferBytes(2, kL3, 0), 1 << 20);  // no processor count: treated as one
  EXPECT_EQ(AutoSocketBufferBytes(4, kL3, 4), 1 << 20);  // one rank per processor again
}

TEST(Options, TheEngineThreadIsBatchWhenRanksOutnumberProcessors) {
  EXPECT_TRUE(EngineThreadIsBatch("auto", 4, 2));
  EXPECT_FALSE(EngineThreadIsBatch("auto", 2, 2));
  EXPECT_FALSE(EngineThreadIsBatch("auto", 8, 96));
  EXPECT_TRUE(EngineThreadIsBatch("batch", 1, 96));
  EXPECT_FALSE(EngineThreadIsBatch("normal", 8, 2));
  EXPECT_EQ(OptionsFromEnvironment(Env{})->engine_sched, "auto");
  auto set = OptionsFromEnvironment(Env{{"KOLO_ENGINE_SCHED", "normal"}});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->engine_sched, "normal");
  EXPECT_TRUE(OptionsFromEnvironment(Env{})->caller_progress);
  EXPECT_FALSE(OptionsFromEnvironment(Env{{"KOLO_CALLER_PROGRESS", "0"}})->caller_progress);
}

TEST(Options, DefaultSocketBuffersFollowTheHost) {
  // The environment's default follows the local rank count; the variable overrides it.
  auto four = OptionsFromEnvironment(Env{{"KOLO_SIZE", "4"}, {"KOLO_RANK", "0"}});
  ASSERT_TRUE(four.ok()) << four.status().ToString();
  EXPECT_EQ(four->socket_buffer_bytes,
            AutoSocketBufferBytes(4, LastLevelCacheBytes(), OnlineCpus()));
  auto set = OptionsFromEnvironment(
      Env{{"KOLO_SIZE", "4"}, {"KOLO_RANK", "0"}, {"KOLO_SOCKET_BUFFER_BYTES", "65536"}});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->socket_buffer_bytes, 65536);
}

TEST(Options, BitRates) {
  EXPECT_EQ(*ParseBitRate("x", "125mbit"), 125e6);
  EXPECT_EQ(*ParseBitRate("x", "1.5gbit"), 1.5e9);
  EXPECT_EQ(*ParseBitRate("x", "800kbit"), 800e3);
  EXPECT_EQ(*ParseBitRate("x", "off"), 0);
  EXPECT_EQ(*ParseBitRate("x", "0"), 0);
  for (const char* bad : {"", "fast", "125", "125mb", "-5mbit", "1e3mbit", "0mbit", " 1gbit",
                          "20000gbit", "gbit", "1.2.3gbit"}) {
    auto r = ParseBitRate("KOLO_PS_PACING", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(fmt::format("KOLO_PS_PACING='{}'", bad)), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("kbit, mbit or gbit"), std::string::npos);
  }
  EXPECT_EQ(FormatBitRate(125e6), "125mbit");
  EXPECT_EQ(FormatBitRate(1.5e9), "1.5gbit");
  EXPECT_EQ(FormatBitRate(0), "off");
  EXPECT_EQ(*ParseBitRate("x", FormatBitRate(15.625e6)), 15.625e6);
}

TEST(Options, ParameterServerPacingFromTheEnvironment) {
  auto set = OptionsFromEnvironment(Env{{"KOLO_SIZE", "3"},
                                        {"KOLO_RANK", "0"},
                                        {"KOLO_BACKEND", "ps"},
                                        {"KOLO_PS_PACING", "125mbit"}});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->ps_pacing_bits_per_s, 125e6);
  auto unset = OptionsFromEnvironment(Env{{"KOLO_SIZE", "3"}, {"KOLO_RANK", "0"}});
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(unset->ps_pacing_bits_per_s, 0);
  auto bad = OptionsFromEnvironment(
      Env{{"KOLO_SIZE", "3"}, {"KOLO_RANK", "0"}, {"KOLO_PS_PACING", "lots"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("KOLO_PS_PACING='lots'"), std::string::npos);
}

TEST(Options, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("x", "64M"), 64ll << 20);
  EXPECT_EQ(*ParseByteSize("x", "8"), 8);
  EXPECT_EQ(*ParseByteSize("x", "1.5K"), 1536);
  EXPECT_EQ(*ParseByteSize("x", "256M"), 256ll << 20);
  EXPECT_FALSE(ParseByteSize("x", "12Q").ok());
  EXPECT_FALSE(ParseByteSize("x", "").ok());
  EXPECT_FALSE(ParseByteSize("x", "-4").ok());
}

}  // namespace
}  // namespace kolo
