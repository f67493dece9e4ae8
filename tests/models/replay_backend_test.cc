// Replay profiles (format, round trip, matching) and the replay compute backend: recorded times
// are slept, gradients have the true sizes, dtypes and order, and mismatches are refused.
#include "models/compute/replay/replay_backend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "models/compute/backend.h"
#include "models/compute/replay/profile.h"
#include "models/zoo/zoo.h"

namespace kolo::models::compute::replay {
namespace {

Graph TinyCnn(int64_t classes = 10) {
  zoo::ModelConfig c;
  c.num_classes = classes;
  auto g = zoo::BuildModel("tiny-cnn", c);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::move(g).value();
}

Profile ProfileFor(const Graph& g, int64_t batch, double ms) {
  Profile p;
  p.model = g.name();
  p.image_size = g.input_shape().h;
  p.num_classes = 10;
  p.batch_size = batch;
  p.compute = "onednn";
  p.device = "test cpu \"quoted\"";
  p.kolo_commit = "abc123";
  p.steps = 3;
  p.update_ms = 2 * ms;
  for (const Layer& l : g.layers()) p.layers.push_back({l.name, ms, 2 * ms});
  return p;
}

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    path_ = ::testing::TempDir() + "replay_profile_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter_++) + ".json";
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST(ReplayProfileTest, RoundTripKeepsEveryField) {
  const Graph g = TinyCnn();
  Profile p = ProfileFor(g, 4, 0.125);
  p.layers[1].forward_ms = 1.0 / 3.0;
  p.timing = "marks";
  p.step_ms = 2.5;
  for (auto& l : p.layers) {
    l.forward_issue_ms = 0.0625;
    l.backward_issue_ms = 0.03125;
  }
  auto back = ProfileFromJson(ProfileToJson(p), "mem");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->model, "tiny-cnn");
  EXPECT_EQ(back->image_size, 8);
  EXPECT_EQ(back->num_classes, 10);
  EXPECT_EQ(back->batch_size, 4);
  EXPECT_EQ(back->precision, "fp32");
  EXPECT_EQ(back->compute, "onednn");
  EXPECT_EQ(back->device, "test cpu \"quoted\"");
  EXPECT_EQ(back->kolo_commit, "abc123");
  EXPECT_EQ(back->steps, 3);
  EXPECT_DOUBLE_EQ(back->update_ms, 0.25);
  ASSERT_EQ(back->layers.size(), g.layers().size());
  for (size_t i = 0; i < g.layers().size(); ++i)
    EXPECT_EQ(back->layers[i].name, g.layers()[i].name);
  EXPECT_NEAR(back->layers[1].forward_ms, 1.0 / 3.0, 1e-6);
  EXPECT_DOUBLE_EQ(back->layers[2].backward_ms, 0.25);
  EXPECT_EQ(back->timing, "marks");
  EXPECT_DOUBLE_EQ(back->step_ms, 2.5);
  EXPECT_DOUBLE_EQ(back->layers[2].forward_issue_ms, 0.0625);
  EXPECT_DOUBLE_EQ(back->layers[2].backward_issue_ms, 0.03125);
  // A profile written before time marks (no timing, step or issue times) reads as synchronised.
  std::string old = ProfileToJson(ProfileFor(g, 4, 0.125));
  old.erase(old.find("  \"timing\""), old.find("\"layers\"") - old.find("  \"timing\""));
  auto legacy = ProfileFromJson(old, "old.json");
  ASSERT_TRUE(legacy.ok()) << legacy.status().ToString() << "\n" << old;
  EXPECT_EQ(legacy->timing, "synchronised");
  EXPECT_EQ(legacy->step_ms, 0);
  EXPECT_LT(legacy->layers[1].forward_issue_ms, 0);
  TempFile f("");
  ASSERT_TRUE(SaveProfile(p, f.path()).ok());
  auto loaded = LoadProfile(f.path());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(ProfileToJson(*loaded), ProfileToJson(*back));
}

TEST(ReplayProfileTest, MalformedFilesNameTheProblem) {
  const Graph g = TinyCnn();
  const std::string good = ProfileToJson(ProfileFor(g, 4, 0.1));
  auto expect_error = [](const std::string& text, const std::string& needle) {
    auto r = ProfileFromJson(text, "p.json");
    ASSERT_FALSE(r.ok()) << "accepted: " << text;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("p.json"), std::string::npos) << r.status().message();
  };
  expect_error("not json", "not a JSON object");
  std::string s = good;
  s.replace(s.find("kolo-replay-profile"), 19, "something-else-here");
  expect_error(s, "'format'");
  s = good;
  s.replace(s.find("\"version\": 1"), 12, "\"version\": 9");
  expect_error(s, "version 9");
  s = good;
  s.replace(s.find("\"batch_size\""), 12, "\"batch_sizes\"");
  expect_error(s, "missing field 'batch_size'");
  s = good;
  s.replace(s.find("\"forward_ms\": 0.1"), 17, "\"forward_ms\": -1");
  expect_error(s, "layers[0]");
  s = good;
  s.replace(s.find("\"onednn\""), 8, "\"replay\"");
  expect_error(s, "timed backend");
  s = good;
  s.replace(s.find("\"synchronised\""), 14, "\"guessed\"");
  expect_error(s, "'timing' is 'guessed': allowed are marks, synchronised");
  auto missing = LoadProfile("/nonexistent/dir/profile.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/profile.json"), std::string::npos);
}

TEST(ReplayProfileTest, MismatchesAreRefusedNamingTheField) {
  const Graph g = TinyCnn();
  const Profile good = ProfileFor(g, 4, 0.1);
  ASSERT_TRUE(CheckProfileMatches(good, g, 4, "fp32", "p.json").ok());
  auto expect = [&](const Profile& p, int64_t batch, const std::string& precision,
                    const std::string& needle) {
    Status s = CheckProfileMatches(p, g, batch, precision, "p.json");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("p.json"), std::string::npos) << s.message();
  };
  expect(good, 8, "fp32", "the batch size is 4 in the profile but 8 here");
  expect(good, 4, "fp16", "the precision is fp32 in the profile but fp16 here");
  Profile p = good;
  p.model = "tiny-mlp";
  expect(p, 4, "fp32", "the model is tiny-mlp");
  p = good;
  p.layers.pop_back();
  expect(p, 4, "fp32", "the number of layers");
  p = good;
  p.layers[2].name = "conv9";
  expect(p, 4, "fp32", "layer 2 is 'conv9' in the profile but '" + g.layers()[2].name + "'");
  p = good;
  p.image_size = 16;
  expect(p, 4, "fp32", "the image size is 16");
  p = good;
  p.num_classes = 5;
  expect(p, 4, "fp32", "the number of classes is 5");
}

TEST(ReplayBackendTest, SleepsRecordedTimesAndEmitsTrueSizedZeroGradients) {
  const Graph g = TinyCnn();
  const double ms = 2.0;
  TempFile f(ProfileToJson(ProfileFor(g, 4, ms)));
  auto backend = CreateComputeBackend("replay");
  ASSERT_TRUE(backend.ok());
  ComputeBackend& b = **backend;
  EXPECT_STREQ(b.name(), "replay");
  BackendConfig config;
  config.batch = 4;
  config.profile_path = f.path();
  ASSERT_TRUE(b.Prepare(g, config).ok());
  EXPECT_EQ(b.DeviceName(), "test cpu \"quoted\"");
  std::vector<float> images(static_cast<size_t>(4 * g.input_shape().size()));
  std::vector<int32_t> labels(4, 1);
  ASSERT_TRUE(b.SetInput(images, labels).ok());
  EXPECT_FALSE(b.SetInput(images, std::vector<int32_t>(3, 1)).ok());

  const int n = static_cast<int>(g.layers().size());
  b.TakeKernelSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (int l = 0; l < n; ++l) ASSERT_TRUE(b.Forward(l).ok());
  for (int l = n - 1; l > 0; --l) ASSERT_TRUE(b.Backward(l, false).ok());
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Forward: n layers x ms; backward: n - 1 layers x 2 ms. The carried oversleep can shorten a
  // later sleep by at most what the earlier one overshot, so the total never falls short.
  const double expected = 1e-3 * (n * ms + (n - 1) * 2 * ms);
  EXPECT_GE(elapsed, expected * 0.999);
  const double slept = b.TakeKernelSeconds();
  EXPECT_GE(slept, expected * 0.999);
  EXPECT_LE(slept, elapsed + 1e-6);
  auto loss = b.Loss();
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(*loss, 0.0);

  for (int p : g.BackpropOrder()) {
    const Parameter& param = g.params()[static_cast<size_t>(p)];
    GradientView v = b.Gradient(p);
    ASSERT_NE(v.data, nullptr);
    EXPECT_EQ(v.numel, param.numel) << param.name;
    EXPECT_EQ(v.dtype, DataType::kFloat32);
    EXPECT_EQ(v.device, -1);
    std::vector<float> grad(static_cast<size_t>(param.numel), 1.0f);
    ASSERT_TRUE(b.GetGradient(p, grad).ok());
    for (float x : grad) ASSERT_EQ(x, 0.0f) << param.name;
    std::vector<float> values(static_cast<size_t>(param.numel), 0.5f);
    ASSERT_TRUE(b.SetParameter(p, values).ok());
    std::vector<float> back(values.size());
    ASSERT_TRUE(b.GetParameter(p, back).ok());
    EXPECT_EQ(back, values);
    ASSERT_TRUE(b.Update(p, SgdConfig{}, 1.0).ok());
    ASSERT_TRUE(b.GetParameter(p, back).ok());
    EXPECT_EQ(back, values) << "replay updates must leave the weights unchanged";
  }
  // All updates together sleep the recorded update time less what the backward's last sleep
  // overshot (carried over; on a loaded host that can be the whole update time), so the pass as a
  // whole never falls short of forward + backward + update. Without the update sleeps it would, by
  // the update time less one wake-up's lateness.
  const double whole_pass =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(whole_pass, expected + 2 * ms * 1e-3 * 0.999);
  EXPECT_FALSE(b.Forward(n).ok());
  EXPECT_FALSE(b.SetParameter(0, std::vector<float>(1)).ok());
}

// One pass of every recorded time (forward of each layer, backward of each but the input, every
// update) through `b`; returns the seconds the backend says it slept.
double SleepOnePass(ComputeBackend& b, const Graph& g) {
  const int n = static_cast<int>(g.layers().size());
  b.TakeKernelSeconds();
  for (int l = 0; l < n; ++l) EXPECT_TRUE(b.Forward(l).ok());
  for (int l = n - 1; l > 0; --l) EXPECT_TRUE(b.Backward(l, false).ok());
  for (int p : g.BackpropOrder()) EXPECT_TRUE(b.Update(p, SgdConfig{}, 1.0).ok());
  return b.TakeKernelSeconds();
}

// Time dilation K sleeps every recorded time K times over: a whole pass accumulates K times the
// profile's total. Not a timing test: the carried oversleep keeps the sum of many sleeps at what
// was asked plus one wake-up's lateness, so the bounds only tell K from 1 and from K squared.
TEST(ReplayBackendTest, DilationSleepsEveryRecordedTimeKTimesOver) {
  const Graph g = TinyCnn();
  const double ms = 5.0;
  const Profile profile = ProfileFor(g, 4, ms);
  TempFile f(ProfileToJson(profile));
  double total_s = 1e-3 * profile.update_ms;
  for (const LayerTiming& t : profile.layers) total_s += 1e-3 * t.forward_ms;
  for (size_t l = 1; l < profile.layers.size(); ++l)
    total_s += 1e-3 * profile.layers[l].backward_ms;
  std::vector<float> images(static_cast<size_t>(4 * g.input_shape().size()));
  std::vector<int32_t> labels(4, 1);
  for (double k : {1.0, 4.0}) {
    auto backend = CreateComputeBackend("replay");
    ASSERT_TRUE(backend.ok());
    BackendConfig config;
    config.batch = 4;
    config.profile_path = f.path();
    config.dilation = k;
    ASSERT_TRUE((*backend)->Prepare(g, config).ok());
    ASSERT_TRUE((*backend)->SetInput(images, labels).ok());
    const double slept = SleepOnePass(**backend, g);
    EXPECT_GE(slept, k * total_s * 0.999) << "dilation " << k;
    EXPECT_LE(slept, k * total_s * 1.5 + 0.25) << "dilation " << k;
  }
}

TEST(ReplayBackendTest, DilationBelowOneOrNotANumberIsRefused) {
  const Graph g = TinyCnn();
  TempFile f(ProfileToJson(ProfileFor(g, 4, 0.01)));
  for (double k : {0.5, 0.0, -3.0, std::nan("")}) {
    auto b = CreateComputeBackend("replay");
    BackendConfig config;
    config.batch = 4;
    config.profile_path = f.path();
    config.dilation = k;
    Status s = (*b)->Prepare(g, config);
    ASSERT_FALSE(s.ok()) << k;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("allowed: a number >= 1"), std::string::npos) << s.message();
  }
}

TEST(ReplayBackendTest, HalfPrecisionProfilesEmitFloatGradientsAsMixedPrecisionDoes) {
  const Graph g = TinyCnn();
  Profile p = ProfileFor(g, 2, 0.01);
  p.precision = "fp16";
  TempFile f(ProfileToJson(p));
  auto backend = CreateComputeBackend("replay");
  ASSERT_TRUE(backend.ok());
  BackendConfig config;
  config.batch = 2;
  config.profile_path = f.path();
  config.precision = Precision::kFp16;
  ASSERT_TRUE((*backend)->Prepare(g, config).ok());
  // fp32 master weights: the engine reduces float32 gradients, as with the cudnn backend.
  EXPECT_EQ((*backend)->Gradient(0).dtype, DataType::kFloat32);
}

TEST(ReplayBackendTest, PrepareRefusesMissingOrMismatchedProfiles) {
  const Graph g = TinyCnn();
  TempFile f(ProfileToJson(ProfileFor(g, 4, 0.01)));
  {
    auto b = CreateComputeBackend("replay");
    BackendConfig config;
    config.batch = 4;
    Status s = (*b)->Prepare(g, config);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("--profile"), std::string::npos) << s.message();
  }
  {
    auto b = CreateComputeBackend("replay");
    BackendConfig config;
    config.batch = 8;
    config.profile_path = f.path();
    Status s = (*b)->Prepare(g, config);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("batch size is 4 in the profile but 8"), std::string::npos)
        << s.message();
  }
  {
    zoo::ModelConfig c;
    c.num_classes = 10;
    auto other = zoo::BuildModel("tiny-mlp", c);
    ASSERT_TRUE(other.ok());
    auto b = CreateComputeBackend("replay");
    BackendConfig config;
    config.batch = 4;
    config.profile_path = f.path();
    Status s = (*b)->Prepare(*other, config);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("the model is tiny-cnn in the profile but tiny-mlp"),
              std::string::npos)
        << s.message();
  }
}

// The repository's models/profiles/. __FILE__ may be relative (ccache's base-directory rewriting
// makes it relative to the directory the compiler ran in: the build tree, or a folder of it).
std::filesystem::path ProfilesDir() {
  namespace fs = std::filesystem;
  const fs::path file(__FILE__);
  std::vector<fs::path> candidates = {file};
  if (file.is_relative()) {
    std::error_code ec;
    const fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
    for (fs::path base = exe_dir; !ec && !base.empty() && base != base.root_path();
         base = base.parent_path()) {
      candidates.push_back(base / file);
    }
  }
  for (const fs::path& c : candidates) {
    if (fs::exists(c)) return c.parent_path().parent_path().parent_path() / "models" / "profiles";
  }
  return file.parent_path().parent_path().parent_path() / "models" / "profiles";
}

// The profiles shipped in models/profiles/ play against the zoo's current graphs.
// Resident memory of this process in bytes (/proc/self/statm), or -1 where it cannot be read.
double ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  double pages = 0, resident = -1;
  if (!(statm >> pages >> resident)) return -1;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// A replay rank holds its gradients, not a second copy of the model: parameters stay unkept while
// they are zero (what replay's are, and what their broadcast brings), and are kept from the first
// value that is not.
TEST(ReplayBackendTest, ZeroParametersCostNoMemory) {
  if (ResidentBytes() < 0) GTEST_SKIP() << "/proc/self/statm is not readable here";
  auto graph = zoo::BuildModel("vgg16");
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  const std::string path = (ProfilesDir() / "vgg16-h100-b64.json").string();
  auto backend = CreateComputeBackend("replay");
  ASSERT_TRUE(backend.ok());
  BackendConfig config;
  config.batch = 64;
  config.precision = Precision::kTf32;  // the profile's
  config.profile_path = path;
  const double before = ResidentBytes();
  const Status prepared = (*backend)->Prepare(*graph, config);
  ASSERT_TRUE(prepared.ok()) << prepared.ToString();
  const double model_bytes = 4.0 * static_cast<double>(graph->NumParameterElements());
  const double grew = ResidentBytes() - before;
  // The gradients (553 MB), and well short of twice that.
  EXPECT_GT(grew, 0.9 * model_bytes);
  EXPECT_LT(grew, 1.3 * model_bytes) << "parameters of zeros were kept";
  // A broadcast of zeros into every parameter keeps nothing more; a value that is not zero is
  // kept and read back, its neighbours still zero.
  const int fc6 = static_cast<int>(graph->params().size()) - 6;
  for (size_t p = 0; p < graph->params().size(); ++p) {
    std::vector<float> zeros(static_cast<size_t>(graph->params()[p].numel), 0.0f);
    ASSERT_TRUE((*backend)->SetParameter(static_cast<int>(p), zeros).ok());
  }
  EXPECT_LT(ResidentBytes() - before, 1.3 * model_bytes) << "zeros set were kept";
  std::vector<float> values(static_cast<size_t>(graph->params()[fc6].numel), 0.0f);
  values[7] = 2.5f;
  ASSERT_TRUE((*backend)->SetParameter(fc6, values).ok());
  std::vector<float> back(values.size(), 1.0f);
  ASSERT_TRUE((*backend)->GetParameter(fc6, back).ok());
  EXPECT_EQ(back, values);
  std::vector<float> other(static_cast<size_t>(graph->params()[0].numel), 1.0f);
  ASSERT_TRUE((*backend)->GetParameter(0, other).ok());
  for (float v : other) ASSERT_EQ(v, 0.0f);
  // Zeros set over kept values replace them.
  std::fill(values.begin(), values.end(), 0.0f);
  ASSERT_TRUE((*backend)->SetParameter(fc6, values).ok());
  ASSERT_TRUE((*backend)->GetParameter(fc6, back).ok());
  EXPECT_EQ(back, values);
}

TEST(ReplayProfileTest, ShippedProfilesMatchTheZoo) {
  const std::filesystem::path dir = ProfilesDir();
  for (const char* model : {"resnet101", "inception3", "vgg16"}) {
    const std::string path = (dir / (std::string(model) + "-onednn-b16.json")).string();
    auto profile = LoadProfile(path);
    ASSERT_TRUE(profile.ok()) << profile.status().ToString();
    auto graph = zoo::BuildModel(model);
    ASSERT_TRUE(graph.ok()) << graph.status().ToString();
    Status s = CheckProfileMatches(*profile, *graph, 16, "fp32", path);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(profile->compute, "onednn");
    EXPECT_GE(profile->steps, 1);
    double total = 0;
    for (const LayerTiming& t : profile->layers) total += t.forward_ms + t.backward_ms;
    EXPECT_GT(total, 100.0) << path << ": a full-size model at batch 16 takes longer than that";
  }
  // Every other shipped profile (the GPUs') plays against its model at its batch and precision;
  // one timed by marks sums to about its measured step (synchronised ones overstate it).
  int others = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string path = entry.path().string();
    if (entry.path().extension() != ".json" || path.find("-onednn-") != std::string::npos) continue;
    SCOPED_TRACE(path);
    auto profile = LoadProfile(path);
    ASSERT_TRUE(profile.ok()) << profile.status().ToString();
    auto graph = zoo::BuildModel(profile->model);
    ASSERT_TRUE(graph.ok()) << graph.status().ToString();
    Status s = CheckProfileMatches(*profile, *graph, profile->batch_size, profile->precision, path);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (profile->timing == "marks") {
      double total = profile->update_ms;
      for (const LayerTiming& t : profile->layers) total += t.forward_ms + t.backward_ms;
      EXPECT_GT(profile->step_ms, 0);
      EXPECT_NEAR(total, profile->step_ms, 0.1 * profile->step_ms);
    }
    ++others;
  }
  EXPECT_GE(others, 3) << "the GPU profiles are gone from " << dir;
}

}  // namespace
}  // namespace kolo::models::compute::replay
