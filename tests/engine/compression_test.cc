// Gradient compression (Options::compression) through the whole engine: float32 tensors travel
// in float16 or bfloat16 under every allreduce algorithm, flat and hierarchical, fused and alone,
// summed and averaged; other dtypes are left alone; the bytes on the wire halve; ranks that
// disagree on it stop at start-up.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/dtype.h"
#include "engine/engine.h"
#include "engine/execution/executor.h"
#include "tests/engine/engine_test_util.h"

namespace kolo {
namespace {

using testing::RankOptions;
using testing::RunRanks;

// Rank r's element i: a value of either sign across several binades, so that rounding to half
// precision changes most of them.
float Input(int rank, size_t i) {
  uint64_t x = static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  const float u = static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;  // [-1, 1)
  return std::ldexp(u, static_cast<int>(i % 7) - 3);
}

// Unit roundoff of the wire type: float16 keeps 11 significant bits, bfloat16 8.
double Roundoff(DataType wire) {
  return wire == DataType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

bool IsHalfValue(DataType wire, float v) {
  if (wire == DataType::kFloat16) return HalfToFloat(FloatToHalf(v)) == v;
  return BFloat16ToFloat(FloatToBFloat16(v)) == v;
}

struct Case {
  std::string compression;
  std::string algorithm;
  bool hierarchical;
  int size;
};

class CompressedAllreduce : public ::testing::TestWithParam<Case> {};

// Every result lies within the rounding bound of the exact sum (each input rounded once, each of
// the at most size - 1 partial sums once more, the average's scaling exact), and is itself a
// value of the wire type times the scale: proof that it travelled in half precision.
TEST_P(CompressedAllreduce, ResultsAreTheSumWithinHalfPrecisionsRounding) {
  const Case c = GetParam();
  const DataType wire = *execution::CompressionDataType(c.compression);
  const int size = c.size;
  RunRanks(
      size,
      [&](int r) {
        Options o = RankOptions(r, size);
        o.compression = c.compression;
        o.allreduce_algorithm = c.algorithm;
        o.fusion_threshold_bytes = 64 << 10;  // the largest tensor runs alone
        if (c.hierarchical) {
          o.hierarchical_allreduce = true;
          o.host_name = r < size / 2 ? "left" : "right";
        }
        return o;
      },
      [&](int rank, Engine& engine) {
        // Small tensors (fused), one large one (alone above the threshold below), an average.
        const std::vector<size_t> counts = {1, 7, 1000, 300000};
        std::vector<std::vector<float>> in, out;
        std::vector<Handle> handles;
        for (size_t k = 0; k < counts.size(); ++k) {
          in.emplace_back(counts[k]);
          out.emplace_back(counts[k], -7.0f);
          for (size_t i = 0; i < counts[k]; ++i) in[k][i] = Input(rank, i + k);
          const ReduceOp op = k == 2 ? ReduceOp::kAverage : ReduceOp::kSum;
          auto h = engine.AllreduceAsync(fmt::format("g{}", k), in[k].data(), out[k].data(),
                                         DataType::kFloat32, {static_cast<int64_t>(counts[k])}, op);
          ASSERT_TRUE(h.ok()) << h.status().ToString();
          handles.push_back(*h);
        }
        for (Handle h : handles) ASSERT_TRUE(engine.Wait(h).ok());
        const double u = Roundoff(wire);
        for (size_t k = 0; k < counts.size(); ++k) {
          const double scale = k == 2 ? 1.0 / size : 1.0;
          size_t outside = 0, not_half = 0, changed = 0;
          for (size_t i = 0; i < counts[k]; ++i) {
            double exact = 0, magnitude = 0;
            float float_sum = 0;
            for (int r = 0; r < size; ++r) {
              exact += Input(r, i + k);
              magnitude += std::fabs(Input(r, i + k));
              float_sum += Input(r, i + k);
            }
            // float16's subnormals round to a fixed 2^-25 instead.
            const double bound = (size + 1) * (u * magnitude + std::ldexp(1.0, -24)) * scale;
            outside += std::fabs(out[k][i] - exact * scale) > bound;
            // A sum is a value of the wire type (an average too, where 1/size is exact).
            if (k != 2) not_half += !IsHalfValue(wire, out[k][i]);
            changed += out[k][i] != static_cast<float>(float_sum * scale);
          }
          EXPECT_EQ(outside, 0u) << "rank " << rank << ", tensor " << k;
          EXPECT_EQ(not_half, 0u) << "rank " << rank << ", tensor " << k << ": not "
                                  << c.compression;
          EXPECT_GT(changed, counts[k] / 2)
              << "rank " << rank << ", tensor " << k << ": results as float32's, not compressed";
          EXPECT_EQ(in[k][0], Input(rank, k)) << "the input must be left unchanged";
        }
        const Engine::Stats s = engine.stats();
        EXPECT_EQ(s.allreduce_wire_bytes * 2, s.allreduce_bytes);
      });
}

INSTANTIATE_TEST_SUITE_P(Engine, CompressedAllreduce,
                         ::testing::Values(Case{"fp16", "ring", false, 4},
                                           Case{"bf16", "ring", false, 4},
                                           Case{"fp16", "recursive-doubling", false, 3},
                                           Case{"bf16", "halving-doubling", false, 4},
                                           Case{"fp16", "halving-doubling", false, 3},
                                           Case{"fp16", "auto", true, 4},
                                           Case{"bf16", "ring", true, 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.compression + "_" + info.param.algorithm +
                                              (info.param.hierarchical ? "_hierarchical" : "") +
                                              "_" + std::to_string(info.param.size);
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// Only float32 is compressed: float64 and int32 tensors in the same fused group come out exact.
TEST(Compression, OtherDtypesTravelAsTheyAre) {
  RunRanks(
      3,
      [](int r) {
        Options o = RankOptions(r, 3);
        o.compression = "fp16";
        return o;
      },
      [](int rank, Engine& engine) {
        std::vector<double> d(100);
        std::vector<int32_t> n(100);
        for (size_t i = 0; i < d.size(); ++i) {
          // Exact in double in any order of summation, lost in any half type.
          d[i] = 1.0 + std::ldexp(static_cast<double>(rank + i + 1), -40);
          n[i] = 100000 * (rank + 1) + static_cast<int32_t>(i);
        }
        auto h1 = engine.AllreduceAsync("d", d.data(), d.data(), DataType::kFloat64, {100},
                                        ReduceOp::kSum);
        auto h2 =
            engine.AllreduceAsync("n", n.data(), n.data(), DataType::kInt32, {100}, ReduceOp::kSum);
        ASSERT_TRUE(h1.ok() && h2.ok());
        ASSERT_TRUE(engine.Wait(*h1).ok());
        ASSERT_TRUE(engine.Wait(*h2).ok());
        for (size_t i = 0; i < d.size(); ++i) {
          double want = 0;
          for (int r = 0; r < 3; ++r) want += 1.0 + std::ldexp(static_cast<double>(r + i + 1), -40);
          ASSERT_EQ(d[i], want) << i;
          ASSERT_EQ(n[i], 600000 + 3 * static_cast<int32_t>(i)) << i;
        }
        const Engine::Stats s = engine.stats();
        EXPECT_EQ(s.allreduce_wire_bytes, s.allreduce_bytes);
      });
}

// The ring's bytes on the wire for one 16 MiB float32 allreduce: 2(N-1)/N of the payload without
// compression, half that with it.
TEST(Compression, HalvesTheBytesOnTheWire) {
  constexpr int kRanks = 4;
  constexpr size_t kCount = 4 << 20;
  std::vector<int64_t> sent(2);
  for (int pass = 0; pass < 2; ++pass) {
    RunRanks(
        kRanks,
        [&](int r) {
          Options o = RankOptions(r, kRanks);
          o.compression = pass == 0 ? "none" : "bf16";
          o.allreduce_algorithm = "ring";
          return o;
        },
        [&](int rank, Engine& engine) {
          std::vector<float> buf(kCount, 1.0f);
          auto h = engine.AllreduceAsync("big", buf.data(), buf.data(), DataType::kFloat32,
                                         {static_cast<int64_t>(kCount)}, ReduceOp::kSum);
          ASSERT_TRUE(h.ok());
          ASSERT_TRUE(engine.Wait(*h).ok());
          EXPECT_EQ(buf[kCount - 1], 4.0f);
          if (rank == 0) sent[static_cast<size_t>(pass)] = engine.stats().transport_bytes_sent;
        });
  }
  const double payload = 4.0 * kCount * 2 * (kRanks - 1) / kRanks;
  EXPECT_GE(sent[0], payload);
  EXPECT_LT(sent[0], payload * 1.01);
  EXPECT_GE(sent[1], payload / 2);
  EXPECT_LT(sent[1], payload / 2 * 1.01);
}

TEST(Compression, RanksThatDisagreeFailAtStartUpNamingThem) {
  constexpr int kRanks = 3;
  const std::vector<Status> results = testing::CreateStatuses(kRanks, [](int r) {
    auto o = RankOptions(r, kRanks);
    o.compression = r == 2 ? "fp16" : "none";
    return o;
  });
  for (int r = 0; r < kRanks; ++r) {
    const Status& s = results[static_cast<size_t>(r)];
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << s.ToString();
    EXPECT_NE(s.message().find("compression is 'fp16' on rank 2, 'none' on ranks 0,1"),
              std::string::npos)
        << s.ToString();
  }
}

TEST(Compression, UnknownNamesAreRefusedNamingTheAllowed) {
  Options o;
  o.compression = "fp8";
  const Status s = o.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("compression 'fp8' is unknown: allowed are none, fp16, bf16"),
            std::string::npos)
      << s.ToString();
  EXPECT_FALSE(execution::CompressionDataType("FP16").ok());
  EXPECT_EQ(*execution::CompressionDataType("bf16"), DataType::kBFloat16);
}

}  // namespace
}  // namespace kolo
