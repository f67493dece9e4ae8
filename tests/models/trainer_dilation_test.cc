// kolo-train's time dilation (--dilation K): refused but with replay compute and for K < 1, and a
// dilated run takes K times the wall time yet reports the represented pace: every time in its run
// record is the measured one / K, so the same profile gives the same step time at K = 1 and K = 4.
// The bounds are proportions (K times the profile's total, never K squared), not a performance
// test: the replay backend's carried oversleep keeps the sum of many sleeps at what was asked.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "models/compute/replay/profile.h"
#include "models/trainer/train_flags.h"
#include "models/trainer/train_run.h"
#include "models/zoo/zoo.h"

namespace kolo::models::trainer {
namespace {

constexpr int kWarmup = 1;
constexpr int kSteps = 4;

class TempPath {
 public:
  explicit TempPath(const std::string& name) {
    path_ = ::testing::TempDir() + "dilation_" + std::to_string(::getpid()) + "_" + name;
  }
  ~TempPath() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A profile of tiny-cnn at batch 4: every layer 3 ms forward and 4 ms backward, 2 ms of updates.
compute::replay::Profile TinyProfile() {
  zoo::ModelConfig c;
  c.num_classes = 10;
  auto g = zoo::BuildModel("tiny-cnn", c);
  EXPECT_TRUE(g.ok());
  compute::replay::Profile p;
  p.model = g->name();
  p.image_size = g->input_shape().h;
  p.num_classes = 10;
  p.batch_size = 4;
  p.compute = "onednn";
  p.device = "test";
  p.steps = 1;
  p.update_ms = 2;
  for (const Layer& l : g->layers()) {
    p.layers.push_back({l.name, 3.0, l.kind == LayerKind::kInput ? 0.0 : 4.0});
  }
  return p;
}

double StepMs(const compute::replay::Profile& p) {
  double ms = p.update_ms;
  for (const auto& t : p.layers) ms += t.forward_ms + t.backward_ms;
  return ms;
}

ParsedFlags Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "kolo-train");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseTrainFlags(static_cast<int>(argv.size()), argv.data());
}

std::vector<std::string> ReplayArgs(const std::string& profile, const std::string& json) {
  return {"--model",
          "tiny-cnn",
          "--num-classes",
          "10",
          "--batch-size",
          "4",
          "--compute",
          "replay",
          "--profile",
          profile,
          "--backend",
          "none",
          "--num-warmup-batches",
          std::to_string(kWarmup),
          "--num-batches",
          std::to_string(kSteps),
          "--json",
          json,
          "--display-every",
          "100"};
}

struct Outcome {
  nlohmann::json record;
  double wall_s = 0;
};

Outcome Train(const std::string& profile, double dilation, const std::string& name) {
  TempPath json(name + ".json");
  auto args = ReplayArgs(profile, json.path());
  args.push_back("--dilation");
  args.push_back(std::to_string(dilation));
  ParsedFlags flags = Parse(args);
  EXPECT_TRUE(flags.options.has_value()) << "exit " << flags.exit_code;
  Outcome out;
  if (!flags.options) return out;
  std::atomic<bool> stop{false};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(RunTraining(*flags.options, stop, "test"), kExitOk);
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream in(json.path());
  std::stringstream text;
  text << in.rdbuf();
  out.record = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  return out;
}

TEST(TrainerDilationTest, RefusedWithoutReplayOrBelowOne) {
  TempPath profile("refused-profile.json");
  ASSERT_TRUE(compute::replay::SaveProfile(TinyProfile(), profile.path()).ok());
  TempPath json("refused.json");
  const auto expect_refused = [](std::vector<std::string> args, const std::string& needle) {
    ::testing::internal::CaptureStderr();
    ParsedFlags flags = Parse(args);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_FALSE(flags.options.has_value());
    EXPECT_EQ(flags.exit_code, 2) << err;
    EXPECT_NE(err.find(needle), std::string::npos) << err;
  };
  // Another compute backend: refused for the dilation, whether or not this build has oneDNN.
  expect_refused({"--model", "tiny-cnn", "--compute", "onednn", "--dilation", "4"}, "--dilation");
  auto args = ReplayArgs(profile.path(), json.path());
  args.insert(args.end(), {"--dilation", "0.5"});
  expect_refused(args, "--dilation");
  args = ReplayArgs(profile.path(), json.path());
  args.insert(args.end(), {"--dilation", "nan"});
  expect_refused(args, "--dilation");
  // Plain replay takes it.
  args = ReplayArgs(profile.path(), json.path());
  args.insert(args.end(), {"--dilation", "2.5"});
  ParsedFlags ok = Parse(args);
  ASSERT_TRUE(ok.options.has_value());
  EXPECT_DOUBLE_EQ(ok.options->dilation, 2.5);
}

TEST(TrainerDilationTest, KTimesTheWallTimeAtTheSameRepresentedPace) {
  const compute::replay::Profile p = TinyProfile();
  TempPath profile("profile.json");
  ASSERT_TRUE(compute::replay::SaveProfile(p, profile.path()).ok());
  const double step_ms = StepMs(p);
  const Outcome plain = Train(profile.path(), 1, "k1");
  const Outcome dilated = Train(profile.path(), 4, "k4");
  for (const Outcome* o : {&plain, &dilated}) {
    ASSERT_TRUE(o->record.is_object());
    ASSERT_EQ(o->record["status"], "ok") << o->record.dump();
  }
  EXPECT_DOUBLE_EQ(plain.record["settings"]["dilation"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(dilated.record["settings"]["dilation"].get<double>(), 4.0);
  // The dilated run slept every step four times over...
  EXPECT_GE(dilated.wall_s, 4 * (kWarmup + kSteps) * step_ms * 1e-3 * 0.999);
  // ...and reports each step at the profile's pace: neither 4 times it (not divided) nor a
  // quarter of it (not stretched).
  for (const Outcome* o : {&plain, &dilated}) {
    const auto& r = o->record["results"];
    const double k = o->record["settings"]["dilation"].get<double>();
    SCOPED_TRACE("dilation " + std::to_string(k));
    for (const char* field : {"step_time_ms_median", "step_time_ms_mean"}) {
      EXPECT_GE(r[field].get<double>(), step_ms * 0.95) << field;
      EXPECT_LE(r[field].get<double>(), step_ms * 2.0) << field;
    }
    double forward_ms = 0;
    for (const auto& t : p.layers) forward_ms += t.forward_ms;
    EXPECT_GE(r["forward_ms"].get<double>(), forward_ms * 0.95);
    EXPECT_LE(r["forward_ms"].get<double>(), forward_ms * 2.0);
    // images/sec is the batch over the represented step.
    const double rate = r["total_images_per_sec"].get<double>();
    EXPECT_NEAR(rate, 4.0 / (r["step_time_ms_mean"].get<double>() * 1e-3), rate * 0.01);
    EXPECT_LE(rate, 4.0 / (step_ms * 0.95e-3));
    EXPECT_GE(rate, 4.0 / (step_ms * 2.0e-3));
  }
}

}  // namespace
}  // namespace kolo::models::trainer
