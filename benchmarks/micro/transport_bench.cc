// kolo's ring allreduce over each transport this build has, at 4 ranks as threads of one process
// (float32, 1, 16 and 64 MiB): tcp (loopback sockets), shm (shared memory) and, where rdma-core's
// headers were found, rdma over the software verbs device. That last row is labelled as what it
// is: the device copies memory in-process under one mutex, so the row measures the RDMA
// transport's protocol (slots, credits, adverts, zero-copy writes, the collectives' scratch path)
// against the others, not RDMA hardware. On a host with an RDMA device, kolo-allreduce-bench
// --transport rdma measures the real thing across processes.
//
// Counters: busbw (nccl-tests' bus bandwidth, 2 (n-1)/n x bytes / time, in bytes/s). Every
// benchmark checks its first allreduce against the exact sum and exits 1 on a mismatch, so the
// CTest smoke run fails.
#include <benchmark/benchmark.h>

#include <barrier>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/collectives/collectives.h"
#include "engine/common/status.h"
#include "engine/transport/registry.h"
#include "kolo/config.h"

namespace kolo {
namespace {

constexpr int kRanks = 4;
constexpr size_t kMaxBytes = size_t{64} << 20;

// kRanks connected devices over one transport, with persistent rank threads that run one
// allreduce per round.
class Job {
 public:
  Job(const std::string& transport, const std::string& verbs) {
    transport::ConnectSettings s;
    s.secret = "0123456789abcdef0123456789abcdef";
    s.timeout = std::chrono::milliseconds(30000);
    s.ib_verbs = verbs;
    s.hosts = bootstrap::HostLayout(std::vector<std::string>(kRanks, "h0"));
    devices_.resize(kRanks);
    std::vector<Status> statuses(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        auto d = transport::Connect(transport, s, store_, r, kRanks);
        if (d.ok()) {
          devices_[r] = std::move(d).value();
        } else {
          statuses[r] = d.status();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
      if (!statuses[r].ok()) {
        error_ = statuses[r].ToString();
        return;
      }
    }
    bufs_.resize(kRanks);
    regions_.resize(kRanks);
    comms_.resize(kRanks);
    scratch_.resize(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      bufs_[r].assign(kMaxBytes / 4, 0.0f);
      auto region = devices_[r]->Register(bufs_[r].data(), kMaxBytes);
      if (!region.ok()) {
        error_ = region.status().ToString();
        return;
      }
      regions_[r] = std::move(region).value();
      comms_[r].device = devices_[r].get();
    }
    for (int r = 0; r < kRanks; ++r) workers_.emplace_back([this, r] { Loop(r); });
  }
  ~Job() {
    if (!workers_.empty()) {
      stop_ = true;
      start_.arrive_and_wait();
      for (auto& t : workers_) t.join();
    }
    regions_.clear();
  }
  const std::string& error() const { return error_; }

  // Fills every rank's first `count` floats with rank-dependent small integers.
  void Fill(size_t count) {
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < count; ++i) bufs_[r][i] = static_cast<float>((i * 7 + r * 13) % 11);
    }
  }
  // Whether every rank holds the exact sum.
  bool Check(size_t count) const {
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < kRanks; ++q) want += static_cast<float>((i * 7 + q * 13) % 11);
        if (bufs_[r][i] != want) return false;
      }
    }
    return true;
  }
  // One allreduce of `count` floats on every rank; the first error, or OK.
  Status Round(size_t count) {
    count_ = count;
    start_.arrive_and_wait();
    done_.arrive_and_wait();
    for (const Status& s : round_status_) {
      if (!s.ok()) return s;
    }
    return Status::OK();
  }

 private:
  void Loop(int r) {
    for (;;) {
      start_.arrive_and_wait();
      if (stop_) return;
      round_status_[r] = collectives::RingAllreduce(comms_[r], *regions_[r], 0, count_,
                                                    DataType::kFloat32, scratch_[r]);
      done_.arrive_and_wait();
    }
  }

  bootstrap::InMemoryStore store_;
  std::vector<std::unique_ptr<transport::Device>> devices_;
  std::vector<std::vector<float>> bufs_;
  std::vector<std::unique_ptr<transport::Region>> regions_;
  std::vector<collectives::Comm> comms_;
  std::vector<collectives::Scratch> scratch_;
  std::vector<std::thread> workers_;
  std::barrier<> start_{kRanks + 1};
  std::barrier<> done_{kRanks + 1};
  std::vector<Status> round_status_ = std::vector<Status>(kRanks);
  size_t count_ = 0;
  bool stop_ = false;
  std::string error_;
};

// One Job per transport, made at first use and kept for the process.
Job& JobFor(const std::string& transport, const std::string& verbs) {
  static std::map<std::string, std::unique_ptr<Job>> jobs;
  auto& job = jobs[transport + "/" + verbs];
  if (!job) job = std::make_unique<Job>(transport, verbs);
  return *job;
}

void Allreduce(benchmark::State& state, const std::string& transport, const std::string& verbs) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / 4;
  Job& job = JobFor(transport, verbs);
  if (!job.error().empty()) {
    state.SkipWithError(("cannot connect: " + job.error()).c_str());
    return;
  }
  job.Fill(count);
  Status s = job.Round(count);
  if (!s.ok() || !job.Check(count)) {
    std::fprintf(stderr, "transport_bench: %s: wrong result or error: %s\n", transport.c_str(),
                 s.ToString().c_str());
    std::exit(1);
  }
  for (auto _ : state) {
    s = job.Round(count);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  state.counters["busbw"] =
      benchmark::Counter(2.0 * (kRanks - 1) / kRanks * static_cast<double>(bytes) *
                             static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

void Register(const std::string& label, const std::string& transport, const std::string& verbs) {
  benchmark::RegisterBenchmark(
      ("RingAllreduce4Ranks/" + label).c_str(),
      [transport, verbs](benchmark::State& st) { Allreduce(st, transport, verbs); })
      ->Arg(1 << 20)
      ->Arg(16 << 20)
      ->Arg(64 << 20)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace kolo

int main(int argc, char** argv) {
  kolo::Register("tcp", "tcp", "");
  kolo::Register("shm", "shm", "");
#if KOLO_HAVE_IBVERBS
  kolo::Register("rdma_over_the_software_verbs_device_not_RDMA_hardware", "rdma", "soft");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
