// kolo-sim's arithmetic against hand-computed cases, its monotonicity in bandwidth, and the
// calibration fit on synthetic data with known parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/collectives/collectives.h"
#include "models/zoo/zoo.h"
#include "sim/autotune.h"
#include "sim/calibrate.h"
#include "sim/model.h"

namespace kolo::sim {
namespace {

Network TwoHosts() {
  Network net;
  net.hosts = 2;
  net.per_host = 1;
  net.nic_bytes_per_s = 1e9;
  net.nic_latency_s = 10e-6;
  net.intra_bytes_per_s = 1e10;
  return net;
}

TEST(SimModelTest, TwoRankRingOfOneTensor) {
  // 2 ranks, 8 MB: reduce-scatter 1 step and allgather 1 step of 4 MB each way at 1 GB/s, plus
  // 10 us each, plus summing 4 MB at 2 GB/s: 2 * (10 us + 4 ms) + 2 ms = 10.02 ms.
  EXPECT_NEAR(RingAllreduceTime(TwoHosts(), 8e6, 2e9), 2 * (10e-6 + 4e-3) + 2e-3, 1e-12);
}

TEST(SimModelTest, RingLatencyAddsUpAlongItsHops) {
  // 2 hosts x 2 ranks, a buffer too small to see: each of the 2 (4 - 1) steps passes a piece one
  // hop on, and half of the ring's hops cross a NIC (10 us), half stay within a host (2 us).
  Network net = TwoHosts();
  net.per_host = 2;
  net.intra_latency_s = 2e-6;
  EXPECT_NEAR(RingAllreduceTime(net, 4, 0), 6 * (0.5 * 10e-6 + 0.5 * 2e-6), 1e-8);  // + ns of bytes
  // One rank per host: every hop crosses a NIC.
  net.per_host = 1;
  EXPECT_NEAR(RingAllreduceTime(net, 2, 0), 2 * 10e-6, 1e-8);
}

TEST(SimModelTest, RecursiveDoublingIsLog2StepsOfTheWholeBuffer) {
  // 4 hosts, one rank each, 4 KB: 2 exchanges of 4 KB at 1 GB/s plus 10 us, each summed at
  // 2 GB/s: 2 * (10 us + 4.096 us + 2.048 us).
  Network net = TwoHosts();
  net.hosts = 4;
  EXPECT_NEAR(RecursiveDoublingAllreduceTime(net, 4096, 2e9), 2 * (10e-6 + 4.096e-6 + 2.048e-6),
              1e-12);
  // 5 ranks: rank 4 folds into rank 0 first (a whole-buffer phase plus its sum) and gets the
  // result back at the end.
  net.hosts = 5;
  EXPECT_NEAR(
      RecursiveDoublingAllreduceTime(net, 4096, 2e9),
      2 * (10e-6 + 4.096e-6 + 2.048e-6) + (10e-6 + 4.096e-6 + 2.048e-6) + (10e-6 + 4.096e-6),
      1e-12);
}

TEST(SimModelTest, HalvingDoublingMovesTheRingsBytesInFewerSteps) {
  // 8 hosts, 8 MB: halving steps move 4, 2, 1 MB and are summed; the doubling steps move them
  // back: 2 * 3 * 10 us + 2 * 7 MB / 1 GB/s + 7 MB / 2 GB/s of sums.
  Network net = TwoHosts();
  net.hosts = 8;
  const double t = HalvingDoublingAllreduceTime(net, 8e6, 2e9);
  EXPECT_NEAR(t, 6 * 10e-6 + 2 * 7e6 / 1e9 + 7e6 / 2e9, 1e-9);
  // The same bytes as the ring, 6 latencies instead of 14.
  const double ring = RingAllreduceTime(net, 8e6, 2e9);
  EXPECT_NEAR(ring - t, 8 * 10e-6, 1e-6);
}

// Hierarchical allreduce is pipelined in chunks of Comm::hierarchical_chunk_bytes: a buffer of one
// chunk pays its three stages in turn; a buffer of many overlaps them, faster than the stages one
// after another and never faster than its slowest stage.
TEST(SimModelTest, HierarchicalAllreducePipelinesItsChunks) {
  Network net = TwoHosts();
  net.hosts = 4;
  net.per_host = 4;
  net.intra_bytes_per_s = 10e9;
  net.intra_latency_s = 5e-6;
  const double chunk = static_cast<double>(collectives::Comm{}.hierarchical_chunk_bytes);
  const double one = HierarchicalAllreduceTime(net, chunk, 2e9);
  const double many = HierarchicalAllreduceTime(net, 16 * chunk, 2e9);
  EXPECT_GT(one, 0);
  EXPECT_LT(many, 16 * one);      // overlapped
  EXPECT_GT(many, 15 * one / 3);  // the slowest stage of each chunk, at least a third of one
}

TEST(SimModelTest, AutoRunsTheEnginesChoiceAndTheCrossoversFollowLatency) {
  Network net = TwoHosts();
  net.hosts = 16;
  std::string ran;
  AllreduceTime(net, 4096, 2e9, "auto", false, &ran);
  EXPECT_EQ(ran, "recursive-doubling");
  AllreduceTime(net, 256 << 10, 2e9, "auto", false, &ran);
  EXPECT_EQ(ran, "halving-doubling");
  AllreduceTime(net, 64 << 20, 2e9, "auto", false, &ran);
  EXPECT_EQ(ran, "ring");
  // Latency-bound: recursive doubling's 4 steps beat the ring's 30.
  EXPECT_LT(RecursiveDoublingAllreduceTime(net, 4096, 2e9), RingAllreduceTime(net, 4096, 2e9));
  // Bandwidth-bound: recursive doubling moves the whole buffer 4 times, the ring under twice.
  EXPECT_GT(RecursiveDoublingAllreduceTime(net, 64 << 20, 2e9),
            RingAllreduceTime(net, 64 << 20, 2e9));
}

TEST(SimModelTest, OneShotOnOneHostOverSharedMemoryOnly) {
  // One step's latency per 32 KiB piece, two copies, N - 1 additions of the buffer.
  Network net;
  net.hosts = 1;
  net.per_host = 4;
  net.intra_latency_s = 5e-6;
  net.intra_copy_bytes_per_s = 4e9;
  net.intra_bytes_per_s = 4e9;
  net.host_area = true;
  EXPECT_NEAR(OneShotAllreduceTime(net, 4096, 2e9), 5e-6 + 2 * 4096 / 4e9 + 3 * 4096 / 2e9, 1e-12);
  EXPECT_NEAR(OneShotAllreduceTime(net, 65536, 2e9), 2 * 5e-6 + 2 * 65536 / 4e9 + 3 * 65536 / 2e9,
              1e-12);
  std::string ran;
  AllreduceTime(net, 4096, 2e9, "auto", false, &ran);
  EXPECT_EQ(ran, "one-shot");
  net.host_area = false;
  AllreduceTime(net, 4096, 2e9, "auto", false, &ran);
  EXPECT_EQ(ran, "recursive-doubling");
  // MakeNetwork gives the area only to one host whose transport is auto or shm.
  Calibration cal;
  Point p;
  p.ranks = 4;
  p.ranks_per_host = 4;
  p.shm_within_host = true;
  EXPECT_TRUE(MakeNetwork(p, cal, 0).host_area);
  p.shm_within_host = false;  // --transport tcp: loopback, no area
  EXPECT_FALSE(MakeNetwork(p, cal, 0).host_area);
  p.shm_within_host = true;
  p.ranks_per_host = 2;  // two hosts of two: an area on each, no flat one-shot
  const Network two = MakeNetwork(p, cal, 0);
  EXPECT_TRUE(two.host_area);
  AllreduceTime(two, 4096, 2e9, "auto", false, &ran);
  EXPECT_EQ(ran, "recursive-doubling");
  // Hierarchical: one-shot within the host, then recursive doubling across the two hosts.
  const double t = AllreduceTime(two, 4096, 2e9, "auto", true, &ran);
  EXPECT_EQ(ran, "one-shot+recursive-doubling");
  Network local = two, across = two;
  local.hosts = 1;
  across.per_host = 1;
  EXPECT_NEAR(
      t, OneShotAllreduceTime(local, 4096, 2e9) + RecursiveDoublingAllreduceTime(across, 4096, 2e9),
      1e-12);
  AllreduceTime(two, 4 << 20, 2e9, "auto", true, &ran);
  EXPECT_EQ(ran, "ring");
}

TEST(SimModelTest, SharedCoresSlowHostBoundCostsOnly) {
  Calibration cal;
  Point p;
  p.ranks = 4;
  p.ranks_per_host = 4;
  EXPECT_EQ(HostShare(p, cal), 1);  // host_cores 0: cores enough
  cal.host_cores = 2;
  EXPECT_EQ(HostShare(p, cal), 2);
  const Network four = MakeNetwork(p, cal);
  p.ranks = p.ranks_per_host = 2;
  EXPECT_EQ(HostShare(p, cal), 1);
  const Network two = MakeNetwork(p, cal);
  EXPECT_NEAR(four.intra_bytes_per_s, two.intra_bytes_per_s / 2, 1);
  EXPECT_NEAR(four.nic_bytes_per_s, two.nic_bytes_per_s, 1);
}

TEST(SimCalibrateTest, FitsTheCommittedEmulatedClusterBench) {
  // kolo-allreduce-bench (--op avg) on scripts/cluster's hosts at 1 Gbit/s (tbf, burst 262144 B):
  // 2, 4 and 8 hosts, 8 KB to 32 MB, as committed; the committed calibration is this fit.
  const std::string dir = std::string(KOLO_SOURCE_DIR) + "/sim/calibrations/";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir + "bench")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("emulated-", 0) == 0 && e.path().extension() == ".json") {
      files.push_back(e.path().string());
    }
  }
  ASSERT_GE(files.size(), 3u);
  std::vector<BenchSample> samples;
  for (const auto& f : files) {
    auto s = ReadBenchJson(f);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (BenchSample x : *s) {
      x.burst_bytes = 262144;
      samples.push_back(x);
    }
  }
  auto fit = FitSamples(samples);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  // Below the links' payload rate (1 Gbit/s x 1448/1514 = 119.5 MB/s), and not far below.
  EXPECT_GT(fit->bytes_per_s, 0.85 * 119.5e6);
  EXPECT_LT(fit->bytes_per_s, 1.0 * 119.5e6);
  EXPECT_EQ(fit->predicted_s.size(), samples.size());
  EXPECT_EQ(fit->weights.size(), samples.size());
  auto cal = LoadCalibration(dir + "emulated-tbf-bench.json");
  ASSERT_TRUE(cal.ok()) << cal.status().ToString();
  EXPECT_NEAR(cal->tcp.efficiency, fit->bytes_per_s / 125e6, 1e-9);
  EXPECT_NEAR(cal->tcp.latency_us, fit->latency_s * 1e6, 1e-6);
  EXPECT_NEAR(cal->engine_overhead_us, fit->engine_s * 1e6, 1e-6);
  // The residuals kolo-sim calibrate printed for it (sim/calibrations/bench/*.fit.txt).
  EXPECT_LT(fit->median_abs_error, 0.1);
  // Its streams' spread is scripts/cluster-incast's, per worker count (bench/incast-*.json).
  for (int workers : {2, 4, 8}) {
    std::ifstream in(dir + "bench/incast-" + std::to_string(workers) + "workers.json");
    ASSERT_TRUE(in) << workers;
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j.at("workers").get<int>(), workers);
    EXPECT_NEAR(cal->ps_stream_spread.at(workers), j.at("ps_stream_spread").get<double>(), 1e-12);
  }
}

TEST(SimModelTest, IncastSharesTheServersLink) {
  // Four workers on hosts 1..4 push 1 MB each to a server on host 0 at once: its ingress carries
  // 4 MB at 1 GB/s, 4 ms, plus one latency.
  Network net = TwoHosts();
  net.hosts = 5;
  std::vector<Flow> flows;
  for (int w = 1; w <= 4; ++w) flows.push_back({w, 0, 1e6});
  EXPECT_NEAR(PhaseTime(net, flows), 10e-6 + 4e-3, 1e-12);
  // Spread over four servers, no link carries more than 1 MB.
  flows.clear();
  for (int w = 1; w <= 4; ++w) flows.push_back({w, (w + 1) % 5, 1e6});
  EXPECT_NEAR(PhaseTime(net, flows), 10e-6 + 1e-3, 1e-12);
}

Point PaperPoint(const std::string& model, const std::string& backend, int ranks) {
  Point p;
  p.model = model;
  p.profile = std::string(KOLO_SOURCE_DIR) + "/models/profiles/" + model + "-h100-b64.json";
  p.batch_size = 64;
  p.ranks = ranks;
  p.ranks_per_host = ranks >= 4 ? 4 : 1;
  p.backend = backend;
  p.ps_servers = 2;
  return p;
}

TEST(SimModelTest, AnAlgorithmTheEngineRefusesIsRefused) {
  Point p = PaperPoint("vgg16", "ring", 8);
  p.allreduce_algorithm = "tree";
  auto r = Predict(p, Calibration{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("allreduce algorithm 'tree' is unknown"), std::string::npos)
      << r.status().ToString();
  p.allreduce_algorithm = "recursive-doubling";
  p.hierarchical = true;
  r = Predict(p, Calibration{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("hierarchical"), std::string::npos);
  p.hierarchical = false;
  EXPECT_TRUE(Predict(p, Calibration{}).ok());
}

// Compression halves what every allreduce and every push moves (pulls stay float32), and a
// communication-bound point gets faster; each group pays its casts at the fusion copy rate.
TEST(SimModelTest, CompressionHalvesTheBytesAndPaysItsCasts) {
  Calibration cal;
  for (const std::string backend : {"ring", "mpi", "nccl", "ps"}) {
    SCOPED_TRACE(backend);
    Point p = PaperPoint("vgg16", backend, 16);
    auto plain = Predict(p, cal);
    p.compression = "fp16";
    auto half = Predict(p, cal);
    ASSERT_TRUE(plain.ok() && half.ok());
    EXPECT_NEAR(half->comm_bytes_per_step, plain->comm_bytes_per_step / 2,
                plain->comm_bytes_per_step * 1e-9);
    EXPECT_LT(half->step_ms, plain->step_ms);
    EXPECT_LT(half->comm_ms, plain->comm_ms);
  }
  // The casts cost time: with a very slow copy rate compression is slower than none on a fast
  // network, and with NCCL (on the GPU) it costs nothing of it.
  Calibration slow_copy;
  slow_copy.fusion_copy_gbytes_per_s = 0.05;
  slow_copy.link_gbit = 400;
  Point p = PaperPoint("vgg16", "ring", 8);
  auto plain = Predict(p, slow_copy);
  p.compression = "bf16";
  auto half = Predict(p, slow_copy);
  ASSERT_TRUE(plain.ok() && half.ok());
  EXPECT_GT(half->comm_ms, plain->comm_ms);
  p.compression = "fp8";
  auto bad = Predict(p, cal);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("compression 'fp8' is unknown"), std::string::npos)
      << bad.status().ToString();
}

// The model's autotune: kolo-train's coordinate search over Predict. The choice is the fastest
// kept trial, no slower than the start, and each kept trial beats every trial before it.
TEST(SimModelTest, AutotuneChoosesTheFastestKeptTrial) {
  Calibration cal;
  Point p = PaperPoint("resnet101", "ring", 16);
  p.fusion_threshold_mb = 4;
  p.cycle_time_ms = 5;
  std::vector<AutotuneTrialPrediction> trials;
  auto choice = AutotuneChoice(p, cal, &trials);
  ASSERT_TRUE(choice.ok()) << choice.status().ToString();
  // The start, 3 more thresholds (4 is the start), 3 more cycle times, the other algorithm, and
  // hierarchical allreduce switched (4 hosts of 4 GPUs).
  ASSERT_EQ(trials.size(), 9u);
  EXPECT_NE(trials[8].hierarchical_allreduce, p.hierarchical);
  double best = 0;
  const AutotuneTrialPrediction* last = nullptr;
  for (const auto& t : trials) {
    if (t.kept && &t != &trials[0]) {
      EXPECT_GT(t.images_per_sec, best);
    }
    if (t.kept) {
      best = t.images_per_sec;
      last = &t;
    }
  }
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(choice->fusion_threshold_mb, last->fusion_threshold_mb);
  EXPECT_EQ(choice->cycle_time_ms, last->cycle_time_ms);
  EXPECT_EQ(choice->allreduce_algorithm, last->allreduce_algorithm);
  EXPECT_EQ(choice->hierarchical, last->hierarchical_allreduce);
  auto start = Predict(p, cal);
  auto chosen = Predict(*choice, cal);
  ASSERT_TRUE(start.ok() && chosen.ok());
  EXPECT_GE(chosen->total_images_per_sec, start->total_images_per_sec);
  EXPECT_EQ(chosen->total_images_per_sec, best);
}

// A per-stream cap (calibration tcp.stream_gbit) holds a link only while too few streams share it:
// the ring, one connection per pair, runs at the cap; a parameter server's link, a stream from
// every worker, at the link's rate.
TEST(SimModelTest, StreamCapsHoldOneStreamNotALinkThatManyShare) {
  Network net;
  net.nic_link_bytes_per_s = 10e9;
  net.nic_stream_bytes_per_s = 4e9;
  EXPECT_EQ(NicRate(net, 1), 4e9);
  EXPECT_EQ(NicRate(net, 2), 8e9);
  EXPECT_EQ(NicRate(net, 5), 10e9);
  net.nic_stream_bytes_per_s = 0;
  EXPECT_EQ(NicRate(net, 1), 10e9);

  Calibration capped;
  capped.tcp.efficiency = 0.94;
  capped.tcp.stream_gbit = 13.5;
  Calibration whole = capped;  // every flow held to one stream's rate, as before
  whole.tcp.efficiency = 0.54;
  whole.tcp.stream_gbit = 0;
  const Point ring = PaperPoint("resnet101", "ring", 32);
  auto a = Predict(ring, capped), b = Predict(ring, whole);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->total_images_per_sec, b->total_images_per_sec,
              1e-9 * b->total_images_per_sec);  // 0.94 x 25 > 13.5: the ring is at the cap
  const Point ps = PaperPoint("resnet101", "ps", 32);
  auto c = Predict(ps, capped), d = Predict(ps, whole);
  ASSERT_TRUE(c.ok() && d.ok());
  EXPECT_GT(c->total_images_per_sec, 1.2 * d->total_images_per_sec);
}

TEST(SimModelTest, PsUnderIncastIsSlowerWithMoreWorkersPerServer) {
  Calibration cal;
  auto few = Predict(PaperPoint("vgg16", "ps", 4), cal);
  auto many = Predict(PaperPoint("vgg16", "ps", 16), cal);
  ASSERT_TRUE(few.ok()) << few.status().ToString();
  ASSERT_TRUE(many.ok()) << many.status().ToString();
  EXPECT_GT(many->step_ms, few->step_ms * 2);
}

TEST(SimModelTest, MoreBandwidthNeverSlowsAPrediction) {
  for (const char* model : {"inception3", "resnet101", "vgg16"}) {
    for (const char* backend : {"ring", "ps", "nccl"}) {
      for (int ranks : {2, 8, 64}) {
        // Exactly monotone but for the engine's cycle grid: a collective that ends sooner can
        // shift the next cycle's tick, by less than one cycle time per step.
        double last_ms = 1e30;
        for (double gbit : {1.0, 10.0, 25.0, 100.0, 400.0}) {
          Point p = PaperPoint(model, backend, ranks);
          p.link_gbit = gbit;
          auto r = Predict(p, Calibration{});
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          EXPECT_LE(r->step_ms, last_ms + p.cycle_time_ms)
              << model << " " << backend << " " << ranks << " ranks at " << gbit << " Gbit/s";
          last_ms = r->step_ms;
        }
      }
    }
  }
}

TEST(SimModelTest, OneRankIsTheProfilesOwnRate) {
  auto r = Predict(PaperPoint("resnet101", "none", 1), Calibration{});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->total_images_per_sec, r->single_gpu_images_per_sec, 1e-6);
  Point p = PaperPoint("resnet101", "none", 1);
  p.gpu_rate = 100;
  auto scaled = Predict(p, Calibration{});
  ASSERT_TRUE(scaled.ok());
  EXPECT_NEAR(scaled->total_images_per_sec, 100, 1e-6);
}

TEST(SimModelTest, ExpectedMaxOfNormalsMatchesItsClosedForms) {
  // E[max of 2] = 1/sqrt(pi), E[max of 3] = 3/(2 sqrt(pi)); beyond, the published tables of
  // normal order statistics (to 5 decimals).
  const double sqrt_pi = std::sqrt(std::acos(-1.0));
  EXPECT_EQ(ExpectedMaxOfNormals(1), 0);
  EXPECT_NEAR(ExpectedMaxOfNormals(2), 1 / sqrt_pi, 1e-9);
  EXPECT_NEAR(ExpectedMaxOfNormals(3), 1.5 / sqrt_pi, 1e-9);
  EXPECT_NEAR(ExpectedMaxOfNormals(4), 1.02938, 1e-5);
  EXPECT_NEAR(ExpectedMaxOfNormals(10), 1.53875, 1e-5);
  EXPECT_NEAR(ExpectedMaxOfNormals(100), 2.50759, 1e-5);
  double last = 0;
  for (int n : {2, 8, 128, 1024, 65536}) {
    EXPECT_GT(ExpectedMaxOfNormals(n), last) << n;
    last = ExpectedMaxOfNormals(n);
  }
  EXPECT_LT(last, 4.5);  // grows like sqrt(2 ln n): 4.71 bounds it at 65,536
}

TEST(SimModelTest, AStepWaitsForTheSlowestRanksCompute) {
  // Fusion on, a fast network, a P100's pace: every gradient's allreduce hides behind backward,
  // and the step is compute. With jitter, each rank's compute is the expected slowest of N: at
  // 128 ranks and a 5% spread, 1 + 0.05 x 2.59 times the mean, and the step with it.
  Point p = PaperPoint("resnet101", "ring", 128);
  p.link_gbit = 400;
  p.gpu_rate = 100;
  Calibration cal;
  auto still = Predict(p, cal);
  ASSERT_TRUE(still.ok());
  EXPECT_LT(still->exposed_comm_ms, 0.01 * still->step_ms);
  cal.step_jitter = 0.05;
  auto jittery = Predict(p, cal);
  ASSERT_TRUE(jittery.ok());
  const double slowest = 1 + 0.05 * ExpectedMaxOfNormals(128);
  EXPECT_NEAR(jittery->step_ms / still->step_ms, slowest, 0.01);
  // The breakdown keeps the mean rank's compute; the wait shows as exposed communication.
  EXPECT_DOUBLE_EQ(jittery->backward_ms, still->backward_ms);
  EXPECT_NEAR(jittery->exposed_comm_ms - still->exposed_comm_ms,
              (slowest - 1) * (still->forward_ms + still->backward_ms + still->update_ms),
              0.01 * still->step_ms);
  // The point's own setting overrides the calibration's; one rank has no one to wait for.
  p.step_jitter = 0;
  auto overridden = Predict(p, cal);
  ASSERT_TRUE(overridden.ok());
  EXPECT_DOUBLE_EQ(overridden->step_ms, still->step_ms);
  Point one = PaperPoint("resnet101", "none", 1);
  one.gpu_rate = 100;
  auto alone = Predict(one, cal);
  ASSERT_TRUE(alone.ok());
  EXPECT_NEAR(alone->total_images_per_sec, 100, 1e-6);
  p.step_jitter = 0.6;
  auto refused = Predict(p, cal);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("step_jitter 0.6"), std::string::npos);
}

TEST(SimCalibrateTest, StepJitterIsARankAlonesSpreadOverItsRate) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  auto cv = ReadStepJitter(write("one.json", R"({"settings": {"ranks": 1}, "status": "ok",
      "results": {"images_per_sec_per_rank": 200.0, "images_per_sec_stddev": 5.0}})"));
  ASSERT_TRUE(cv.ok()) << cv.status().ToString();
  EXPECT_DOUBLE_EQ(*cv, 0.025);
  auto two = ReadStepJitter(write("two.json", R"({"settings": {"ranks": 2}, "status": "ok",
      "results": {"images_per_sec_per_rank": 200.0, "images_per_sec_stddev": 5.0}})"));
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("a run of 2 ranks; allowed: 1"), std::string::npos);
  auto failed = ReadStepJitter(
      write("failed.json", R"({"settings": {"ranks": 1}, "status": "failed", "error": "x"})"));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("'failed'"), std::string::npos);
  auto bench = ReadStepJitter(write("bench.json", R"({"ranks": 2, "hosts": [], "rows": []})"));
  ASSERT_FALSE(bench.ok());
  EXPECT_NE(bench.status().message().find("not a kolo-train --json run record"), std::string::npos);
}

TEST(SimModelTest, EngineTimeIsChargedPerCycleAndPerCollective) {
  // Fusion off: hundreds of collectives in a few cycles. 1 ms of engine time per cycle adds about
  // cycles x 1 ms to the communication, not collectives x 1 ms; 100 us per collective adds
  // collectives x 100 us.
  Point p = PaperPoint("resnet101", "ring", 8);
  p.fusion_threshold_mb = 0;
  auto base = Predict(p, Calibration{});
  Calibration per_cycle, per_collective;
  per_cycle.engine_overhead_us = 1000;
  per_collective.engine_collective_us = 100;
  auto cycles = Predict(p, per_cycle);
  auto collectives = Predict(p, per_collective);
  ASSERT_TRUE(base.ok() && cycles.ok() && collectives.ok());
  EXPECT_GT(cycles->collectives_per_step, 100);
  const double by_cycles = cycles->comm_ms - base->comm_ms;
  EXPECT_GT(by_cycles, 0.5 * cycles->cycles_per_step);
  EXPECT_LT(by_cycles, 2.0 * cycles->cycles_per_step);
  EXPECT_LE(cycles->total_images_per_sec, base->total_images_per_sec);
  const double by_collectives = collectives->comm_ms - base->comm_ms;
  EXPECT_NEAR(by_collectives, 0.1 * collectives->collectives_per_step,
              0.005 * collectives->collectives_per_step);
}

TEST(SimModelTest, StreamSpreadIsInterpolatedInLog2OfTheStreams) {
  Calibration cal;
  EXPECT_EQ(StreamSpread(cal, 8), 0);  // none measured: fair shares
  cal.ps_stream_spread = {{2, 0.05}, {8, 0.11}};
  EXPECT_EQ(StreamSpread(cal, 1), 0);  // one stream has the link to itself
  EXPECT_DOUBLE_EQ(StreamSpread(cal, 2), 0.05);
  EXPECT_NEAR(StreamSpread(cal, 4), 0.05 + 0.5 * 0.06, 1e-12);  // log2: halfway from 2 to 8
  EXPECT_DOUBLE_EQ(StreamSpread(cal, 8), 0.11);
  EXPECT_DOUBLE_EQ(StreamSpread(cal, 64), 0.11);  // beyond the measured: the nearest
}

TEST(SimModelTest, PullsWaitForTheSlowestStreamOfAServersLink) {
  // Eight workers into each of two servers: with the streams' spread, every shard's pull waits for
  // the slowest worker's push, so the step is slower, more so with more spread, and never by more
  // than the whole exchange stretched by 1 / (1 - spread).
  Point p = PaperPoint("resnet101", "ps", 8);
  p.link_gbit = 10;
  Calibration cal;
  auto fair = Predict(p, cal);
  ASSERT_TRUE(fair.ok()) << fair.status().ToString();
  double last_ms = fair->step_ms;
  for (double u : {0.05, 0.1, 0.2}) {
    cal.ps_stream_spread = {{8, u}};
    auto r = Predict(p, cal);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(r->step_ms, last_ms) << "spread " << u;
    EXPECT_LE(r->comm_ms, fair->comm_ms / (1 - u) + 1e-9) << "spread " << u;
    last_ms = r->step_ms;
  }
  // One worker: a single stream, nothing to wait for.
  cal.ps_stream_spread = {{1, 0.5}, {8, 0.2}};
  auto one = Predict(PaperPoint("resnet101", "ps", 1), cal);
  auto one_fair = Predict(PaperPoint("resnet101", "ps", 1), Calibration{});
  ASSERT_TRUE(one.ok() && one_fair.ok());
  EXPECT_DOUBLE_EQ(one->step_ms, one_fair->step_ms);
}

TEST(SimModelTest, PacedPushesShareTheServersLinkEvenly) {
  // Eight workers, one host each, into one server on 10 Gbit/s links: a fair share is 1.25 Gbit/s.
  Point p = PaperPoint("resnet101", "ps", 8);
  p.ranks_per_host = 1;
  p.ps_servers = 1;
  p.link_gbit = 10;
  auto predict = [&](double pace_gbit, const Calibration& cal) {
    Point q = p;
    q.ps_pacing_bits_per_s = pace_gbit * 1e9;
    auto r = Predict(q, cal);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->step_ms : 0.0;
  };
  const Calibration fair;
  Calibration uneven;
  uneven.ps_stream_spread = {{8, 0.5}};
  // With fair shares, a pace at or above the fair share changes nothing: the server's link is the
  // bottleneck either way.
  EXPECT_NEAR(predict(1.25, fair), predict(0, fair), 1e-9);
  EXPECT_NEAR(predict(5, fair), predict(0, fair), 1e-9);
  // Under the measured unevenness, pacing at the fair share evens the pushes out (the pulls keep
  // their spread).
  EXPECT_LT(predict(1.25, uneven), predict(0, uneven));
  // Paces far above the fair share leave the streams as uneven as unpaced ones.
  EXPECT_NEAR(predict(10, uneven), predict(0, uneven), 1e-9);
  // Below the fair share the pace is the bottleneck: the less of it, the slower.
  double last_ms = 1e30;
  for (double pace : {1.25, 1.0, 0.625, 0.3, 0.1}) {
    const double ms = predict(pace, fair);
    EXPECT_GT(ms, pace == 1.25 ? 0 : last_ms) << pace << " Gbit/s";
    last_ms = ms;
  }
  // Above it the streams crowd the link's queue again: just above, the slowest keeps what the
  // others' paces leave (1 - 7 x 0.04 = 0.72 of a fair share at 1.3 Gbit/s, against 0.5
  // unpaced), and from 1 + 0.5 / 7 of it on they are as uneven as unpaced ones. More pace is never
  // faster there (the engine's cycle grid aside).
  const double even = predict(1.25, uneven), unpaced = predict(0, uneven);
  const double just_above = predict(1.3, uneven);
  EXPECT_GT(just_above, even);
  EXPECT_LT(just_above, unpaced);
  last_ms = just_above;
  for (double pace : {1.5, 2.5, 5.0, 10.0}) {
    const double ms = predict(pace, uneven);
    EXPECT_GE(ms, last_ms - p.cycle_time_ms) << pace << " Gbit/s";
    EXPECT_NEAR(ms, unpaced, 1e-9) << pace << " Gbit/s";
    last_ms = ms;
  }
  // Pacing needs TCP.
  Point rdma = p;
  rdma.transport = "rdma";
  rdma.ps_pacing_bits_per_s = 1.25e9;
  auto refused = Predict(rdma, fair);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pacing needs transport tcp"), std::string::npos)
      << refused.status().message();
}

TEST(SimModelTest, PacedSpreadIsTheMeasuredShareInterpolatedInLog2OfThePace) {
  Calibration cal;
  cal.ps_stream_spread = {{8, 0.5}};
  // No share measured: all of the spread, but for what the others' paces leave the slowest.
  EXPECT_EQ(PacedStreamSpread(cal, 8, 1.0), 0);
  EXPECT_NEAR(PacedStreamSpread(cal, 8, 1.04), 7 * 0.04, 1e-12);
  EXPECT_DOUBLE_EQ(PacedStreamSpread(cal, 8, 2), 0.5);
  // Measured at 2 times a fair share: 0.6 of it. From none at 1 to 0.6 at 2 to all at 8 (the
  // stream count), in log2 of the ratio.
  cal.ps_paced_spread_share = {{2.0, 0.6}};
  EXPECT_DOUBLE_EQ(PacedStreamSpread(cal, 8, 2), 0.3);
  EXPECT_NEAR(PacedStreamSpread(cal, 8, std::sqrt(2.0)), 0.5 * 0.3, 1e-12);
  EXPECT_NEAR(PacedStreamSpread(cal, 8, 4), 0.5 * (0.6 + 0.5 * 0.4), 1e-12);
  EXPECT_DOUBLE_EQ(PacedStreamSpread(cal, 8, 8), 0.5);
  EXPECT_DOUBLE_EQ(PacedStreamSpread(cal, 8, 100), 0.5);
  EXPECT_EQ(PacedStreamSpread(cal, 1, 4), 0);  // one stream: nothing to share
  // Read back from JSON, and refused when out of range.
  auto back = CalibrationFromJson(CalibrationToJson(cal), "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ps_paced_spread_share, cal.ps_paced_spread_share);
  for (const char* bad :
       {R"({"format": "kolo-sim-calibration", "name": "x", "ps_paced_spread_share": {"1": 0.5}})",
        R"({"format": "kolo-sim-calibration", "name": "x", "ps_paced_spread_share": {"2": 1.5}})",
        R"({"format": "kolo-sim-calibration", "name": "x", "ps_paced_spread_share": {"two": 0.5}})",
        R"({"format": "kolo-sim-calibration", "name": "x", "ps_paced_spread_share": [0.5]})"}) {
    auto r = CalibrationFromJson(bad, "test");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("ps_paced_spread_share"), std::string::npos)
        << r.status().message();
  }
}

TEST(SimModelTest, CalibrationJsonKeepsEveryField) {
  Calibration c;
  c.name = "t";
  c.host_cores = 2;
  c.engine_overhead_us = 615;
  c.engine_collective_us = 72;
  c.tcp.latency_us = 13.5;
  c.ps_stream_spread = {{2, 0.047}, {8, 0.109}};
  c.intra_large_bytes = 16 << 20;
  c.intra_large_gbytes_per_s = 2.6;
  c.step_jitter = 0.031;
  auto back = CalibrationFromJson(CalibrationToJson(c), "t");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->intra_large_bytes, 16 << 20);
  EXPECT_EQ(back->intra_large_gbytes_per_s, 2.6);
  // Without size regimes the fields are not written, and a calibration without them has none.
  EXPECT_EQ(CalibrationToJson(Calibration{}).find("intra_large"), std::string::npos);
  EXPECT_EQ(CalibrationToJson(Calibration{}).find("step_jitter"), std::string::npos);
  EXPECT_EQ(back->ps_stream_spread, c.ps_stream_spread);
  EXPECT_EQ(back->host_cores, 2);
  EXPECT_EQ(back->engine_overhead_us, 615);
  EXPECT_EQ(back->engine_collective_us, 72);
  EXPECT_EQ(back->tcp.latency_us, 13.5);
  EXPECT_EQ(back->step_jitter, 0.031);
  auto wild = CalibrationFromJson(
      R"({"format": "kolo-sim-calibration", "name": "t", "step_jitter": 0.7})", "f.json");
  ASSERT_FALSE(wild.ok());
  EXPECT_NE(wild.status().message().find("\"step_jitter\" 0.7 is not allowed"), std::string::npos);
  auto bad = CalibrationFromJson(
      R"({"format": "kolo-sim-calibration", "name": "t", "host_cores": -1})", "f.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("host_cores"), std::string::npos);
  for (const char* spread : {R"({"x": 0.1})", R"({"4": 1.0})", R"({"0": 0.1})", R"([0.1])"}) {
    auto wrong = CalibrationFromJson(
        std::string(R"({"format": "kolo-sim-calibration", "name": "t", "ps_stream_spread": )") +
            spread + "}",
        "f.json");
    ASSERT_FALSE(wrong.ok()) << spread;
    EXPECT_NE(wrong.status().message().find("ps_stream_spread"), std::string::npos) << spread;
  }
}

TEST(SimModelTest, BadSettingsAreRefusedByName) {
  Point p = PaperPoint("vgg16", "ring", 6);
  p.ranks_per_host = 4;
  auto r = Predict(p, Calibration{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ranks_per_host"), std::string::npos);
}

// A ring row and a link row of every size at 2, 4 and 8 ranks (one per host), timed by the model
// itself under (lat, bw, reduce), each row's burst `burst`.
std::vector<BenchSample> Synthetic(std::initializer_list<double> sizes, double lat, double bw,
                                   double reduce, double burst = 0) {
  std::vector<BenchSample> samples;
  for (int ranks : {2, 4, 8}) {
    for (double bytes : sizes) {
      for (bool reduces : {true, false}) {
        BenchSample s;
        s.ranks = ranks;
        s.hosts = ranks;
        s.bytes = bytes;
        s.reduces = reduces;
        s.burst_bytes = burst;
        s.seconds = SampleTime(s, lat, bw, reduce);
        samples.push_back(s);
      }
    }
  }
  return samples;
}

TEST(SimCalibrateTest, FitRecoversKnownParameters) {
  const double lat = 40e-6, bw = 2.5e9, reduce = 6e9;
  auto fit = FitSamples(Synthetic({1e6, 4e6, 16e6, 64e6}, lat, bw, reduce));
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_NEAR(fit->latency_s, lat, lat * 1e-6);
  EXPECT_NEAR(fit->bytes_per_s, bw, bw * 1e-6);
  EXPECT_NEAR(fit->reduce_bytes_per_s, reduce, reduce * 1e-6);
  EXPECT_LT(fit->worst_abs_error, 1e-9);
}

TEST(SimCalibrateTest, RowsFarOffTheModelDoNotPullTheFit) {
  // Known parameters, and three small rows held up 3-5x (a scheduler's hiccup on a busy host):
  // the robust fit still recovers the parameters and weights those rows down; a plain least
  // squares would not (the check on the bandwidth is tighter than their pull).
  const double lat = 40e-6, bw = 2.5e9, reduce = 6e9;
  std::vector<BenchSample> samples = Synthetic({8e3, 64e3, 1e6, 4e6, 16e6, 64e6}, lat, bw, reduce);
  for (BenchSample& s : samples) {
    if (s.bytes == 8e3 && !s.reduces) s.seconds *= s.ranks == 8 ? 5 : 3;
  }
  auto fit = FitSamples(samples);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_NEAR(fit->bytes_per_s, bw, bw * 0.01);
  EXPECT_NEAR(fit->reduce_bytes_per_s, reduce, reduce * 0.05);
  EXPECT_NEAR(fit->latency_s, lat, lat * 0.1);
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].bytes == 8e3 && !samples[i].reduces) {
      EXPECT_LT(fit->weights[i], 0.2) << "row " << i;
    } else {
      EXPECT_GT(fit->weights[i], 0.9) << "row " << i;
    }
  }
}

// Rows within one host (2 and 4 ranks), timed by the model with buffers of at least `large`
// bytes moving at `large_bw` instead of `bw`.
std::vector<BenchSample> WithinAHost(double lat, double bw, double reduce, double large,
                                     double large_bw) {
  std::vector<BenchSample> samples;
  for (int ranks : {2, 4}) {
    for (double bytes = 64e3; bytes <= 256e6; bytes *= 2) {
      for (bool reduces : {true, false}) {
        BenchSample s;
        s.ranks = ranks;
        s.bytes = bytes;
        s.reduces = reduces;
        s.seconds = SampleTime(s, lat, bytes >= large ? large_bw : bw, reduce);
        samples.push_back(s);
      }
    }
  }
  return samples;
}

TEST(SimCalibrateTest, SizeRegimesRecoverTheLargeBufferBandwidth) {
  // Copies that slow from 4.5 to 2.5 GB/s once buffers reach 32 MB (2^25 bytes after 64 KB
  // doubled 9 times, 32.768 MB: the first measured size at or above 32e6).
  const double lat = 6e-6, bw = 4.5e9, reduce = 4e9, large = 32e6, large_bw = 2.5e9;
  const auto samples = WithinAHost(lat, bw, reduce, large, large_bw);
  auto fit = FitSamples(samples, /*size_regimes=*/true);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_EQ(fit->large_bytes, 64e3 * 512);
  EXPECT_NEAR(fit->bytes_per_s, bw, bw * 1e-6);
  EXPECT_NEAR(fit->large_bytes_per_s, large_bw, large_bw * 1e-6);
  EXPECT_NEAR(fit->reduce_bytes_per_s, reduce, reduce * 1e-6);
  EXPECT_LT(fit->worst_abs_error, 1e-9);
  // The same rows with one bandwidth for every size: the fit cannot follow them.
  auto one = FitSamples(samples);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->large_bytes, 0);
  EXPECT_GT(one->worst_abs_error, 0.1);
  // Rows with one bandwidth: size regimes find no second one.
  auto plain = FitSamples(WithinAHost(lat, bw, reduce, 1e30, bw), /*size_regimes=*/true);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->large_bytes, 0);
  EXPECT_NEAR(plain->bytes_per_s, bw, bw * 1e-6);
}

TEST(SimModelTest, AStepThatLeavesTheCachesMovesAtTheLargeBufferRate) {
  // Two ranks of one host: where what a step cycles through reaches intra_large_bytes, kolo's
  // collectives within the host move at the large-buffer rate; below it, and under NCCL (GPU
  // links, not the host's copies), at intra_gbytes_per_s.
  Calibration cal;
  cal.intra_gbytes_per_s = 4;
  cal.intra_large_bytes = 16e6;
  cal.intra_large_gbytes_per_s = 2;
  Point p = PaperPoint("vgg16", "ring", 2);
  p.ranks_per_host = 2;
  EXPECT_NEAR(MakeNetwork(p, cal, 8e6).intra_bytes_per_s, 4e9, 1);
  EXPECT_NEAR(MakeNetwork(p, cal, 16e6).intra_bytes_per_s, 2e9, 1);
  EXPECT_NEAR(MakeNetwork(p, cal).intra_bytes_per_s, 4e9, 1);
  p.backend = "nccl";
  EXPECT_NEAR(MakeNetwork(p, cal, 64e6).intra_bytes_per_s, cal.intra_gbytes_per_s * 1e9, 1);
  // In a prediction: VGG-16's 528 MB of gradients are far beyond 16 MB, so every collective,
  // small ones too, moves at the large-buffer rate, as with that rate for every size; with the
  // threshold above the step's bytes, at the small-buffer rate.
  p.backend = "ring";
  Calibration fast = cal, slow = cal, above = cal;
  fast.intra_large_bytes = slow.intra_large_bytes = 0;
  slow.intra_gbytes_per_s = 2;
  above.intra_large_bytes = 1e12;
  auto both = Predict(p, cal), all_fast = Predict(p, fast), all_slow = Predict(p, slow),
       under = Predict(p, above);
  ASSERT_TRUE(both.ok() && all_fast.ok() && all_slow.ok() && under.ok())
      << both.status().ToString();
  EXPECT_GT(both->comm_ms, all_fast->comm_ms * 1.3);
  EXPECT_DOUBLE_EQ(both->comm_ms, all_slow->comm_ms);
  EXPECT_DOUBLE_EQ(under->comm_ms, all_fast->comm_ms);
}

TEST(SimCalibrateTest, ABurstOfUnshapedBytesIsFreeOfBandwidthTime) {
  BenchSample s;
  s.ranks = 4;
  s.hosts = 4;
  s.reduces = false;
  s.burst_bytes = 256e3;
  // 2(n-1) pieces of bytes / n leave each host: 6 x 32 KB fits in the burst, 6 x 1 MB does not.
  s.bytes = 128e3;
  EXPECT_DOUBLE_EQ(SampleTime(s, 10e-6, 1e8, 0), 6 * 10e-6);
  s.bytes = 4e6;
  EXPECT_DOUBLE_EQ(SampleTime(s, 10e-6, 1e8, 0), 6 * 10e-6 + (6e6 - 256e3) / 1e8);
  // Synthetic rows with the burst: a fit told of it recovers the rate exactly.
  auto fit = FitSamples(Synthetic({8e3, 64e3, 512e3, 4e6, 32e6}, 30e-6, 1.1e8, 5e9, 256e3));
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_NEAR(fit->bytes_per_s, 1.1e8, 1.1e8 * 1e-6);
  EXPECT_NEAR(fit->latency_s, 30e-6, 30e-6 * 1e-6);
}

StepSample Step(const std::string& model, bool fused, double collectives, double seconds) {
  StepSample s;
  s.ranks = 4;
  s.hosts = 4;
  s.model = model;
  s.fused = fused;
  s.threshold_bytes = fused ? 64 << 20 : 0;
  s.collectives = collectives;
  s.seconds = seconds;
  s.origin = "bench.json";
  return s;
}

TEST(SimCalibrateTest, EngineTimePerCollectiveFromStepsWithFusionOffAndOn) {
  // A ring model with only a per-step latency: ResNet-101's 314 tensors one by one take
  // (314 - 3) x 2(n-1) latencies more than its 3 fused groups; what the steps differ by beyond
  // that is the engine's, per collective.
  Fit fit;
  fit.latency_s = 20e-6;
  const double per = 50e-6, steps = 2 * 3 * fit.latency_s;
  std::vector<std::string> lines;
  auto us = FitPerCollective({Step("resnet101", false, 314, 0.1 + 314 * (steps + per)),
                              Step("resnet101", true, 3, 0.1 + 3 * (steps + per))},
                             fit, 0, &lines);
  ASSERT_TRUE(us.ok()) << us.status().ToString();
  EXPECT_NEAR(*us, per, 1e-9);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("3 groups"), std::string::npos) << lines[0];
  // A pair only 28 collectives apart (VGG-16) whose steps came out the wrong way round (noise)
  // weighs 28 against 311 and does not move the figure.
  us = FitPerCollective({Step("resnet101", false, 314, 0.1 + 314 * (steps + per)),
                         Step("resnet101", true, 3, 0.1 + 3 * (steps + per)),
                         Step("vgg16", false, 32, 0.18), Step("vgg16", true, 4, 0.21)},
                        fit, 0, &lines);
  ASSERT_TRUE(us.ok());
  EXPECT_NEAR(*us, per, 1e-9);
  // VGG-16's 32 tensors at 64 MiB: the engine's planner makes 4 groups (a group skips a tensor
  // that does not fit and takes later ones that do), as the bench counted them.
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[2].find("vgg16"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("(4 groups)"), std::string::npos) << lines[2];
  // Ranks sharing cores (host share 2) measured everything twice as slow: one rank's own time
  // per collective is half of what they measured.
  StepSample off = Step("resnet101", false, 314, 0.1 + 314 * 2 * (steps + per));
  StepSample on = Step("resnet101", true, 3, 0.1 + 3 * 2 * (steps + per));
  off.host_share = on.host_share = 2;
  us = FitPerCollective({off, on}, fit, 0, &lines);
  ASSERT_TRUE(us.ok());
  EXPECT_NEAR(*us, per, 1e-9);
  // No pair: nothing to fit.
  EXPECT_FALSE(FitPerCollective({Step("resnet101", true, 3, 0.1)}, fit, 0, &lines).ok());
}

TEST(SimCalibrateTest, OneSizeIsNotEnough) {
  BenchSample s;
  s.ranks = 2;
  s.bytes = 1e6;
  s.seconds = 1e-3;
  EXPECT_FALSE(FitSamples({s, s}).ok());
}

}  // namespace
}  // namespace kolo::sim

namespace kolo::sim {
namespace {

// The frameworks' update semantics: at one rank they agree (nothing to wait for); with a network,
// applying every update after the last allreduce (horovod-tf) never ends a step sooner than
// updating each parameter as its own allreduce lands (kolo).
TEST(SimFrameworkTest, UpdatesAfterTheLastAllreduceNeverEndSooner) {
  Calibration cal;
  Point one = PaperPoint("resnet101", "none", 1);
  auto kolo = Predict(one, cal);
  ASSERT_TRUE(kolo.ok()) << kolo.status().ToString();
  for (const char* fw : {"horovod-tf", "ddp"}) {
    one.framework = fw;
    auto r = Predict(one, cal);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_NEAR(r->step_ms, kolo->step_ms, 1e-9 * kolo->step_ms) << fw;
  }
  cal.link_gbit = 1;  // communication-bound
  Point p = PaperPoint("resnet101", "ring", 8);
  auto a = Predict(p, cal);
  p.framework = "horovod-tf";
  auto b = Predict(p, cal);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(b->step_ms, a->step_ms);
  // By at most the whole optimizer: the allreduces are the same.
  EXPECT_LE(b->step_ms, a->step_ms + a->update_ms + 1e-9);
  EXPECT_DOUBLE_EQ(b->comm_bytes_per_step, a->comm_bytes_per_step);
}

// DDP: buckets in backprop order, the first closed at 1 MiB and the others at 25 MiB, one
// allreduce each, no negotiation or cycle, and the same bytes as the engine moves.
TEST(SimFrameworkTest, DdpReducesItsBucketsWithoutNegotiation) {
  Calibration cal;
  Point p = PaperPoint("resnet101", "nccl", 16);
  p.framework = "ddp";
  auto r = Predict(p, cal);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto graph = models::zoo::BuildModel("resnet101");
  ASSERT_TRUE(graph.ok());
  int buckets = 1;
  double filled = 0;
  const auto& params = graph->params();
  const std::vector<int> order = graph->BackpropOrder();
  for (size_t i = 0; i < order.size(); ++i) {
    filled += 4.0 * static_cast<double>(params[static_cast<size_t>(order[i])].numel);
    if (filled >= (buckets == 1 ? kDdpFirstBucketBytes : kDdpBucketBytes) && i + 1 < order.size()) {
      ++buckets;
      filled = 0;
    }
  }
  EXPECT_EQ(r->collectives_per_step, buckets);
  EXPECT_GT(buckets, 5);
  EXPECT_EQ(r->negotiation_ms, 0);
  EXPECT_EQ(r->cycles_per_step, 0);
  p.framework = "kolo";
  auto engine = Predict(p, cal);
  ASSERT_TRUE(engine.ok());
  EXPECT_NEAR(r->comm_bytes_per_step, engine->comm_bytes_per_step,
              1e-9 * engine->comm_bytes_per_step);
}

TEST(SimFrameworkTest, UnknownFrameworksAndDdpWithServersAreRefused) {
  Point p = PaperPoint("vgg16", "ring", 8);
  p.framework = "mxnet";
  auto r = Predict(p, Calibration{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("framework 'mxnet' is not allowed; allowed: kolo, "
                                      "horovod-tf, ddp"),
            std::string::npos)
      << r.status().ToString();
  p = PaperPoint("vgg16", "ps", 8);
  p.framework = "ddp";
  r = Predict(p, Calibration{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'ddp' has no parameter servers"), std::string::npos);
  p.framework = "horovod-tf";
  EXPECT_TRUE(Predict(p, Calibration{}).ok());
}

}  // namespace
}  // namespace kolo::sim

namespace kolo::sim {
namespace {

// Interference: backward stretched by the calibration's fraction times the share communication
// overlaps; nothing to overlap at one rank; never more than the whole fraction.
TEST(SimInterferenceTest, BackwardSlowsByTheOverlappedShare) {
  Calibration plain;
  plain.link_gbit = 10;
  Calibration slowed = plain;
  slowed.interference = 0.2;
  Point one = PaperPoint("resnet101", "none", 1);
  auto alone = Predict(one, slowed);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(alone->interference_ms, 0);
  for (const char* backend : {"ring", "nccl", "ps"}) {
    SCOPED_TRACE(backend);
    Point p = PaperPoint("resnet101", backend, 16);
    auto a = Predict(p, plain);
    auto b = Predict(p, slowed);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->interference_ms, 0);
    EXPECT_GT(b->interference_ms, 0);
    EXPECT_NEAR(b->backward_ms, a->backward_ms + b->interference_ms, 1e-9 * a->backward_ms);
    EXPECT_LE(b->interference_ms, 0.2 * a->backward_ms + 1e-9);
    EXPECT_GE(b->step_ms, a->step_ms);
  }
}

TEST(SimInterferenceTest, TheCalibrationReadsAndWritesIt) {
  Calibration c;
  c.interference = 0.189;
  auto back = CalibrationFromJson(CalibrationToJson(c), "mem");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_DOUBLE_EQ(back->interference, 0.189);
  auto bad = CalibrationFromJson(R"({"format": "kolo-sim-calibration", "name": "x", )"
                                 R"("interference": 1.5})",
                                 "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"interference\" 1.5 is not allowed; allowed: 0 to 1"),
            std::string::npos)
      << bad.status().ToString();
  EXPECT_EQ(CalibrationToJson(Calibration{}).find("interference"), std::string::npos);
}

}  // namespace
}  // namespace kolo::sim

namespace kolo::sim {
namespace {

// Exposed communication by cause: the four parts add up to exposed_comm_ms and each follows the
// cost it stands for; not asked for, they are -1.
TEST(SimExposedByCauseTest, ThePartsAddUpAndFollowTheirCosts) {
  Calibration cal;
  cal.link_gbit = 10;
  cal.engine_overhead_us = 50;
  Point p = PaperPoint("resnet101", "ring", 64);
  auto plain = Predict(p, cal);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->exposed_wire_ms, -1);
  p.exposed_by_cause = true;
  auto split = [&](const Point& point, const Calibration& c) {
    auto r = Predict(point, c);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_NEAR(r->exposed_coordination_ms + r->exposed_latency_ms + r->exposed_host_ms +
                    r->exposed_wire_ms,
                r->exposed_comm_ms, 1e-6 * (1 + r->exposed_comm_ms));
    return *r;
  };
  // The split leaves the prediction itself alone.
  const Prediction base = split(p, cal);
  EXPECT_EQ(base.step_ms, plain->step_ms);
  EXPECT_GT(base.exposed_comm_ms, 0);
  // Fusion off on a fast link: 300-odd collectives of 2 (N - 1) ring steps each, latency-bound.
  Point unfused = p;
  unfused.fusion_threshold_mb = 0;
  Calibration fast = cal;
  fast.link_gbit = 100;
  const Prediction many = split(unfused, fast);
  std::printf(
      "[ info ] unfused: exposed %.2f ms = coordination %.2f + latency %.2f + host %.2f + "
      "wire %.2f\n",
      many.exposed_comm_ms, many.exposed_coordination_ms, many.exposed_latency_ms,
      many.exposed_host_ms, many.exposed_wire_ms);
  EXPECT_GT(many.exposed_latency_ms, 0.5 * many.exposed_comm_ms);
  // A slower link: more wire.
  Calibration slow = cal;
  slow.link_gbit = 1;
  const Prediction wire = split(p, slow);
  EXPECT_GT(wire.exposed_wire_ms, base.exposed_wire_ms);
  EXPECT_GT(wire.exposed_wire_ms, 0.5 * wire.exposed_comm_ms);
  // A long cycle grid: more coordination.
  Point held = unfused;
  held.cycle_time_ms = 20;
  const Prediction grid = split(held, fast);
  EXPECT_GT(grid.exposed_coordination_ms, many.exposed_coordination_ms);
  // A slow host: more host work.
  Calibration slow_host = cal;
  slow_host.reduce_gbytes_per_s = slow_host.fusion_copy_gbytes_per_s = 0.2;
  const Prediction host = split(p, slow_host);
  EXPECT_GT(host.exposed_host_ms, base.exposed_host_ms);
  // Parameter servers coordinate nothing through the engine.
  Point ps_point = PaperPoint("resnet101", "ps", 16);
  ps_point.exposed_by_cause = true;
  const Prediction servers = split(ps_point, cal);
  EXPECT_EQ(servers.exposed_coordination_ms, 0);
}

}  // namespace
}  // namespace kolo::sim
