// A stand-in for a GPU backend's gradients on a CPU: wraps a real backend (oneDNN) and reports
// every gradient as device memory, so that the trainer stages it for the parameter servers as it
// does cuDNN's. StartGradientCopy is truly asynchronous: a thread of the stand-in's own lands the
// copies late and newest first (the opposite of the order they were started), into memory it owns
// (HostStagingBuffer) unless told otherwise. Faults on cue: one parameter's copy fails, or never
// completes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "models/compute/backend.h"

namespace kolo::models::trainer {

// Calls across every stand-in that shares it, for tests that check which staging path ran.
struct StagingCounts {
  std::atomic<int> get_gradient{0};
  std::atomic<int> started_copies{0};
};

struct DeviceGradientOptions {
  bool own_staging = true;  // offer HostStagingBuffer (else the caller's memory is written)
  int fail_param = -1;      // this parameter's copy completes with an error
  int hang_param = -1;      // this parameter's copy never completes
  std::chrono::microseconds delay{500};  // before each copy lands
  std::shared_ptr<StagingCounts> counts = std::make_shared<StagingCounts>();
};

class DeviceGradientBackend final : public compute::ComputeBackend {
 public:
  DeviceGradientBackend(std::unique_ptr<compute::ComputeBackend> inner,
                        DeviceGradientOptions options)
      : inner_(std::move(inner)), options_(options), lander_([this] { Land(); }) {}
  ~DeviceGradientBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    lander_.join();
  }

  const char* name() const override { return inner_->name(); }
  Status Prepare(const Graph& graph, const compute::BackendConfig& config) override {
    graph_ = &graph;
    return inner_->Prepare(graph, config);
  }
  Status SetParameter(int param, std::span<const float> values) override {
    return inner_->SetParameter(param, values);
  }
  Status GetParameter(int param, std::span<float> out) override {
    return inner_->GetParameter(param, out);
  }
  Status GetGradient(int param, std::span<float> out) override {
    ++options_.counts->get_gradient;
    return inner_->GetGradient(param, out);
  }
  Status SetInput(std::span<const float> images, std::span<const int32_t> labels) override {
    return inner_->SetInput(images, labels);
  }
  Status Forward(int layer) override { return inner_->Forward(layer); }
  StatusOr<double> Loss() override { return inner_->Loss(); }
  Status Backward(int layer, bool accumulate) override {
    return inner_->Backward(layer, accumulate);
  }
  compute::GradientView Gradient(int param) override {
    compute::GradientView v = inner_->Gradient(param);
    v.device = 0;
    return v;
  }
  Status Update(int param, const compute::SgdConfig& sgd, double grad_scale) override {
    return inner_->Update(param, sgd, grad_scale);
  }
  Status Synchronize() override { return inner_->Synchronize(); }
  double TakeKernelSeconds() override { return inner_->TakeKernelSeconds(); }

  StatusOr<std::span<float>> HostStagingBuffer(int param) override {
    if (!options_.own_staging) return std::span<float>();
    std::lock_guard<std::mutex> lock(mu_);
    if (staging_.empty()) staging_.resize(graph_->params().size());
    auto& b = staging_[static_cast<size_t>(param)];
    b.resize(static_cast<size_t>(graph_->params()[static_cast<size_t>(param)].numel));
    return std::span<float>(b);
  }

  StatusOr<std::unique_ptr<compute::GradientCopy>> StartGradientCopy(
      int param, std::span<float> out) override {
    ++options_.counts->started_copies;
    const compute::GradientView g = inner_->Gradient(param);
    if (g.data == nullptr || g.numel != static_cast<int64_t>(out.size())) {
      return InvalidArgument("stand-in: parameter {} has {} values, the copy wants {}", param,
                             g.numel, out.size());
    }
    auto state = std::make_shared<CopyState>();
    if (param != options_.hang_param) {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(Job{param, static_cast<const float*>(g.data), out, state});
    }
    cv_.notify_all();
    return std::unique_ptr<compute::GradientCopy>(std::make_unique<Copy>(state));
  }

 private:
  struct CopyState {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  class Copy final : public compute::GradientCopy {
   public:
    explicit Copy(std::shared_ptr<CopyState> s) : s_(std::move(s)) {}
    Status Wait(std::chrono::milliseconds timeout) override {
      std::unique_lock<std::mutex> lock(s_->mu);
      if (!s_->cv.wait_for(lock, timeout, [&] { return s_->done; })) {
        return DeadlineExceeded("stand-in: copy not landed after {} ms", timeout.count());
      }
      return s_->status;
    }

   private:
    std::shared_ptr<CopyState> s_;
  };
  struct Job {
    int param;
    const float* src;
    std::span<float> dst;
    std::shared_ptr<CopyState> state;
  };

  // Lands the newest queued copy after a delay, so completions come in reverse order.
  void Land() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      lock.unlock();
      std::this_thread::sleep_for(options_.delay);
      lock.lock();
      if (jobs_.empty()) continue;
      Job job = jobs_.back();
      jobs_.pop_back();
      lock.unlock();
      Status s;
      if (job.param == options_.fail_param) {
        s = Internal("stand-in: the copy of parameter {} failed", job.param);
      } else {
        std::memcpy(job.dst.data(), job.src, job.dst.size_bytes());
      }
      {
        std::lock_guard<std::mutex> done(job.state->mu);
        job.state->status = s;
        job.state->done = true;
      }
      job.state->cv.notify_all();
      lock.lock();
    }
  }

  std::unique_ptr<compute::ComputeBackend> inner_;
  const DeviceGradientOptions options_;
  const Graph* graph_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<std::vector<float>> staging_;
  bool stop_ = false;
  std::thread lander_;  // last: starts once everything above exists
};

}  // namespace kolo::models::trainer
