// Engine::Retune: every rank switches its fusion threshold, cycle time and allreduce algorithm at
// the same point of the collective stream, collectives stay exact across the switch, and values
// out of range are refused before anything is submitted.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tests/engine/engine_test_util.h"

namespace kolo {
namespace {

using testing::RankOptions;
using testing::RunRanks;

// 20 small tensors a step: fused into one collective at the default threshold, one collective
// each once every rank has switched to threshold 0, and back.
TEST(Retune, EveryRankSwitchesAtTheSamePointAndStaysExact) {
  constexpr int kRanks = 3;
  RunRanks(kRanks, [](int rank, Engine& engine) {
    auto step = [&](int k) {
      std::vector<std::vector<float>> bufs(20, std::vector<float>(100));
      std::vector<Handle> hs;
      for (size_t t = 0; t < bufs.size(); ++t) {
        for (size_t i = 0; i < 100; ++i) {
          bufs[t][i] = static_cast<float>(testing::InputValue(rank, i + t));
        }
        auto h = engine.AllreduceAsync(fmt::format("s{}.t{}", k, t), bufs[t].data(), bufs[t].data(),
                                       DataType::kFloat32, {100}, ReduceOp::kSum);
        ASSERT_TRUE(h.ok()) << h.status().ToString();
        hs.push_back(*h);
      }
      for (Handle h : hs) ASSERT_TRUE(engine.Wait(h).ok());
      for (size_t t = 0; t < bufs.size(); ++t) {
        for (size_t i = 0; i < 100; ++i) {
          ASSERT_EQ(bufs[t][i], static_cast<float>(testing::ExpectedSum(kRanks, i + t)));
        }
      }
    };
    step(0);
    const int64_t fused = engine.stats().collectives;
    Engine::Tunables alone = engine.tunables();
    EXPECT_EQ(alone.fusion_threshold_bytes, 64ll << 20);
    alone.fusion_threshold_bytes = 0;
    alone.cycle_time_ms = 2.5;
    alone.allreduce_algorithm = "recursive-doubling";
    ASSERT_TRUE(engine.Retune("switch.1", alone).ok());
    const int64_t before = engine.stats().collectives;
    step(1);
    EXPECT_EQ(engine.stats().collectives - before, 20) << "every tensor alone after the switch";
    EXPECT_LT(fused, 20) << "the first step fused its tensors";
    const Engine::Tunables now = engine.tunables();
    EXPECT_EQ(now.fusion_threshold_bytes, 0);
    EXPECT_EQ(now.cycle_time_ms, 2.5);
    EXPECT_EQ(now.allreduce_algorithm, "recursive-doubling");
    Engine::Tunables back = now;
    back.fusion_threshold_bytes = 64ll << 20;
    back.allreduce_algorithm = "ring";
    ASSERT_TRUE(engine.Retune("switch.2", back).ok());
    const int64_t again = engine.stats().collectives;
    step(2);
    EXPECT_LT(engine.stats().collectives - again, 20) << "fused again";
  });
}

// Hierarchical allreduce as a tunable: 2 hosts x 2 ranks started with it off but switchable; the
// switch on makes the ring's allreduces hierarchical (its timeline phase appears), the switch off
// flat again, every result exact. A job that cannot switch it refuses before submitting.
TEST(Retune, HierarchicalAllreduceSwitchesOnAndOffAcrossHosts) {
  constexpr int kRanks = 4;
  const std::string base = ::testing::TempDir() + "/kolo_retune_hier.json";
  RunRanks(
      kRanks,
      [&](int r) {
        Options o = RankOptions(r, kRanks);
        o.host_name = r < 2 ? "left" : "right";
        o.hierarchical_switchable = true;
        o.allreduce_algorithm = "ring";
        o.timeline_path = base;
        return o;
      },
      [](int rank, Engine& engine) {
        EXPECT_TRUE(engine.CanSwitchHierarchical());
        EXPECT_FALSE(engine.tunables().hierarchical_allreduce);
        auto step = [&](int k) {
          std::vector<float> buf(300000);
          for (size_t i = 0; i < buf.size(); ++i) {
            buf[i] = static_cast<float>(testing::InputValue(rank, i));
          }
          auto h = engine.AllreduceAsync(fmt::format("h{}", k), buf.data(), buf.data(),
                                         DataType::kFloat32, {300000}, ReduceOp::kSum);
          ASSERT_TRUE(h.ok()) << h.status().ToString();
          ASSERT_TRUE(engine.Wait(*h).ok());
          for (size_t i = 0; i < buf.size(); i += 101) {
            ASSERT_EQ(buf[i], static_cast<float>(testing::ExpectedSum(kRanks, i))) << i;
          }
        };
        step(0);
        Engine::Tunables on = engine.tunables();
        on.hierarchical_allreduce = true;
        ASSERT_TRUE(engine.Retune("hier.on", on).ok());
        step(1);
        // Applied at the end of the switch's cycle: certainly by the time a later one has run.
        EXPECT_TRUE(engine.tunables().hierarchical_allreduce);
        // Hierarchical allows only auto and ring.
        Engine::Tunables bad = on;
        bad.allreduce_algorithm = "recursive-doubling";
        EXPECT_EQ(engine.Retune("hier.bad", bad).code(), StatusCode::kInvalidArgument);
        Engine::Tunables off = on;
        off.hierarchical_allreduce = false;
        ASSERT_TRUE(engine.Retune("hier.off", off).ok());
        step(2);
      });
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::string path =
        rank == 0 ? base
                  : ::testing::TempDir() + fmt::format("/kolo_retune_hier.rank{}.json", rank);
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("HIERARCHICAL_ALLREDUCE"), std::string::npos) << path;
    EXPECT_NE(text.find("REDUCE_SCATTER"), std::string::npos) << path;
    std::remove(path.c_str());
  }

  // One host: nothing to switch.
  RunRanks(2, [](int, Engine& engine) {
    EXPECT_FALSE(engine.CanSwitchHierarchical());
    Engine::Tunables t = engine.tunables();
    t.hierarchical_allreduce = true;
    Status s = engine.Retune("hier.none", t);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("cannot be switched on"), std::string::npos) << s.ToString();
    EXPECT_TRUE(engine.Barrier().ok());
  });
}

TEST(Retune, BadValuesAreRefusedBeforeAnythingIsSubmitted) {
  RunRanks(2, [](int, Engine& engine) {
    Engine::Tunables t = engine.tunables();
    t.cycle_time_ms = 0;
    Status s = engine.Retune("bad.1", t);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("cycle time 0 ms is outside (0, 10000]"), std::string::npos)
        << s.ToString();
    t = engine.tunables();
    t.allreduce_algorithm = "tree";
    s = engine.Retune("bad.2", t);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("tree"), std::string::npos) << s.ToString();
    t = engine.tunables();
    t.fusion_threshold_bytes = -1;
    EXPECT_EQ(engine.Retune("bad.3", t).code(), StatusCode::kInvalidArgument);
    // Nothing was submitted: the engine still agrees on collectives.
    EXPECT_TRUE(engine.Barrier().ok());
  });
}

}  // namespace
}  // namespace kolo
