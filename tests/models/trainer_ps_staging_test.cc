// Parameter servers with gradients off the host (--ps-staging): the trainer stages each one to
// host float32, either with a blocking copy on the training thread (sync) or with copies started
// right after each layer's backward and pushed from a staging thread once they land (overlap).
// Both push the same values, so with the same backend they must train to bit-identical weights,
// and to the weights of the same backend with host gradients (nothing staged at all). oneDNN stands
// in for a GPU (device_gradient_backend.h): its copies land late and in reverse order, so the
// staging thread's ordering and the step's wait for it are exercised; faults on cue check that a
// failed or hung copy fails the step, naming the parameter, within the bounds.
// Also: --ps-staging parsing and the run record's setting.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kolo/config.h"
#include "models/trainer/run_record.h"
#include "models/trainer/train_flags.h"
#include "tests/models/device_gradient_backend.h"
#include "tests/models/trainer_test_util.h"

namespace kolo::models::trainer {
namespace {

using compute::Precision;

MakeBackend StandIn(DeviceGradientOptions options) {
  return [options]() -> StatusOr<std::unique_ptr<compute::ComputeBackend>> {
    KOLO_ASSIGN_OR_RETURN(auto inner, compute::CreateComputeBackend("onednn"));
    return std::unique_ptr<compute::ComputeBackend>(
        std::make_unique<DeviceGradientBackend>(std::move(inner), options));
  };
}

// `backend` prepared for `g` at batch 2 and set to the parameters every test starts from.
Status PrepareAtInitial(compute::ComputeBackend& backend, const Graph& g) {
  compute::BackendConfig bc;
  bc.batch = 2;
  KOLO_RETURN_IF_ERROR(backend.Prepare(g, bc));
  const auto initial = InitialParameters(g, 3);
  for (size_t p = 0; p < initial.size(); ++p) {
    KOLO_RETURN_IF_ERROR(backend.SetParameter(static_cast<int>(p), initial[p]));
  }
  return Status::OK();
}

TEST(PsStagingTest, OverlapTrainsToTheWeightsOfSync) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  DeviceGradientOptions sync_options, overlap_options;
  const auto sync = Train(g, 2, 1, 4, 1, StandIn(sync_options), Precision::kFp32, PsStaging::kSync);
  const auto overlap =
      Train(g, 2, 1, 4, 1, StandIn(overlap_options), Precision::kFp32, PsStaging::kOverlap);
  EXPECT_EQ(overlap, sync);
  // Host gradients are pushed as they are, staged by neither mode.
  EXPECT_EQ(Train(g, 2, 1, 4, 1, MakeOneDnn, Precision::kFp32, PsStaging::kOverlap), sync);
  // Each mode took its own path: 2 workers x kSteps steps x every parameter.
  const int pushes = 2 * kSteps * static_cast<int>(g.params().size());
  EXPECT_EQ(sync_options.counts->get_gradient.load(), pushes);
  EXPECT_EQ(sync_options.counts->started_copies.load(), 0);
  EXPECT_EQ(overlap_options.counts->started_copies.load(), pushes);
  EXPECT_EQ(overlap_options.counts->get_gradient.load(), 0);
}

TEST(PsStagingTest, OverlapWithLocalAggregationAndTwoServers) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  const auto sync = Train(g, 2, 2, 2, 2, StandIn({}), Precision::kFp32, PsStaging::kSync);
  EXPECT_EQ(Train(g, 2, 2, 2, 2, StandIn({}), Precision::kFp32, PsStaging::kOverlap), sync);
}

// A backend without staging memory of its own: the copies land in the trainer's buffers.
TEST(PsStagingTest, OverlapIntoTheTrainersOwnBuffers) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  DeviceGradientOptions options;
  options.own_staging = false;
  const auto sync = Train(g, 2, 1, 4, 1, StandIn({}), Precision::kFp32, PsStaging::kSync);
  EXPECT_EQ(Train(g, 2, 1, 4, 1, StandIn(options), Precision::kFp32, PsStaging::kOverlap), sync);
}

// The default StartGradientCopy (a synchronous GetGradient) serves overlap too.
TEST(PsStagingTest, DefaultCopyIsAlreadyComplete) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  auto made = compute::CreateComputeBackend("onednn");
  ASSERT_TRUE(made.ok());
  ASSERT_TRUE(PrepareAtInitial(**made, g).ok());
  const Batch b = MakeSyntheticBatches(g.input_shape(), 2, 1, kClasses, 7, 0)[0];
  ASSERT_TRUE((*made)->SetInput(b.images, b.labels).ok());
  const int n = static_cast<int>(g.layers().size());
  for (int l = 0; l < n; ++l) ASSERT_TRUE((*made)->Forward(l).ok());
  for (int l = n - 1; l > 0; --l) ASSERT_TRUE((*made)->Backward(l, false).ok());
  for (size_t p = 0; p < g.params().size(); ++p) {
    const auto numel = static_cast<size_t>(g.params()[p].numel);
    std::vector<float> want(numel), got(numel, -1.0f);
    ASSERT_TRUE((*made)->GetGradient(static_cast<int>(p), want).ok());
    auto buffer = (*made)->HostStagingBuffer(static_cast<int>(p));
    ASSERT_TRUE(buffer.ok());
    EXPECT_TRUE(buffer->empty());
    auto copy = (*made)->StartGradientCopy(static_cast<int>(p), got);
    ASSERT_TRUE(copy.ok()) << copy.status().ToString();
    EXPECT_TRUE((*copy)->Wait(std::chrono::milliseconds(0)).ok());
    EXPECT_EQ(got, want) << g.params()[p].name;
  }
}

// 1 worker and 1 server with a fault in parameter `param`'s copy: the step's status.
Status StepWithFault(const Graph& g, DeviceGradientOptions options,
                     std::chrono::milliseconds timeout, double* seconds) {
  Status result = Internal("the worker did not run");
  kolo::testing::RunRanks(
      2,
      [](int r) {
        Options o = kolo::testing::RankOptions(r, 2);
        o.backend = "ps";
        o.ps_servers = 1;
        return o;
      },
      [&](int, Engine& engine) {
        if (engine.role() == Role::kServer) {
          // The worker gives up mid-step: how the server ends is not this test's subject.
          engine.Serve().IgnoreError();
          return;
        }
        auto made = StandIn(options)();
        ASSERT_TRUE(made.ok());
        ASSERT_TRUE(PrepareAtInitial(**made, g).ok());
        TrainerConfig tc;
        tc.wait_timeout = timeout;
        tc.ps_staging = PsStaging::kOverlap;
        Trainer trainer(g, **made, engine, tc);
        ASSERT_TRUE(trainer.BroadcastParameters().ok());
        ASSERT_TRUE(
            trainer.SetData(MakeSyntheticBatches(g.input_shape(), 2, 1, kClasses, 7, 0)).ok());
        const auto t0 = std::chrono::steady_clock::now();
        auto st = trainer.Step();
        *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        result = st.status();
      });
  return result;
}

TEST(PsStagingTest, FailedCopyFailsTheStepNamingTheParameter) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  DeviceGradientOptions options;
  options.fail_param = 1;
  double seconds = 0;
  Status s = StepWithFault(g, options, std::chrono::seconds(20), &seconds);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'" + g.params()[1].name + "'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("copy of parameter 1 failed"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("parameter servers"), std::string::npos) << s.message();
}

TEST(PsStagingTest, HungCopyFailsTheStepWithinTheTimeout) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  DeviceGradientOptions options;
  options.hang_param = static_cast<int>(g.params().size()) - 1;  // of the last layer
  double seconds = 0;
  Status s = StepWithFault(g, options, std::chrono::milliseconds(300), &seconds);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("'" + g.params().back().name + "'"), std::string::npos) << s.message();
  // One timeout for the copy, at most one more for Finish: never one per queued parameter.
  EXPECT_LT(seconds, 5.0);
}

ParsedFlags Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "kolo-train");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseTrainFlags(static_cast<int>(argv.size()), argv.data());
}

TEST(PsStagingTest, BadFlagValueNamesItAndTheAllowedOnes) {
  ::testing::internal::CaptureStderr();
  ParsedFlags flags = Parse({"--model", "tiny-cnn", "--backend", "none", "--ps-staging", "async"});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(flags.options.has_value());
  EXPECT_EQ(flags.exit_code, 2) << err;
  EXPECT_NE(err.find("--ps-staging 'async' is not one of sync, overlap"), std::string::npos) << err;
}

// Parameter servers apply every push, so fp16's skipped (overflowing) steps would reach them: the
// combination is refused before anything runs, naming what is allowed.
TEST(PsStagingTest, Fp16WithParameterServersIsRefused) {
  // Rank 1 of 3, as kolo-run would launch it (a ps job needs a server and a worker); nothing
  // connects, since the flags are refused first.
  const std::pair<const char*, const char*> launch[] = {
      {"KOLO_SIZE", "3"},
      {"KOLO_RANK", "1"},
      {"KOLO_STORE_ADDR", "127.0.0.1:9"},
      {"KOLO_JOB_SECRET", "00112233445566778899aabbccddeeff"}};
  for (const auto& [k, v] : launch) ::setenv(k, v, 1);
  ::testing::internal::CaptureStderr();
  ParsedFlags flags =
      Parse({"--model", "tiny-cnn", "--backend", "ps", "--ps-servers", "1", "--precision", "fp16"});
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (const auto& [k, v] : launch) ::unsetenv(k);
  EXPECT_FALSE(flags.options.has_value());
  EXPECT_EQ(flags.exit_code, 2) << err;
  EXPECT_NE(err.find("--precision fp16 with --backend ps"), std::string::npos) << err;
  EXPECT_NE(err.find("allowed with ps: fp32, tf32, bf16"), std::string::npos) << err;
}

TEST(PsStagingTest, FlagDefaultsToOverlap) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend (the default compute)";
  ParsedFlags flags = Parse({"--model", "tiny-cnn", "--backend", "none"});
  ASSERT_TRUE(flags.options.has_value()) << "exit " << flags.exit_code;
  EXPECT_EQ(flags.options->ps_staging, PsStaging::kOverlap);
  flags = Parse({"--model", "tiny-cnn", "--backend", "none", "--ps-staging", "sync"});
  ASSERT_TRUE(flags.options.has_value()) << "exit " << flags.exit_code;
  EXPECT_EQ(flags.options->ps_staging, PsStaging::kSync);
}

TEST(PsStagingTest, RunRecordSaysWhichRan) {
  RunRecord r;
  r.settings.backend = "ps";
  r.settings.ps_staging = PsStagingName(PsStaging::kSync);
  const auto j = nlohmann::json::parse(RunRecordToJson(r));
  EXPECT_EQ(j["settings"]["ps_staging"], "sync");
}

}  // namespace
}  // namespace kolo::models::trainer
