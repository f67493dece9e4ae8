#include "models/trainer/gradient_stager.h"

#include <fmt/format.h>

#include <utility>

namespace kolo::models::trainer {
namespace {
// Only bounds each cycle of a wait on the condition; every wait re-checks its predicate.
constexpr auto kForever = std::chrono::hours(24);
}  // namespace

GradientStager::GradientStager(Submit submit, std::chrono::milliseconds timeout)
    : submit_(std::move(submit)), timeout_(timeout) {}

GradientStager::~GradientStager() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    cancel_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GradientStager::Add(int param, const std::string* name,
                         std::unique_ptr<compute::GradientCopy> copy, const float* host) {
  {
    MutexLock lock(mu_);
    queue_.push_back(Job{param, name, std::move(copy), host});
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  work_cv_.notify_one();
}

void GradientStager::Loop() {
  mu_.lock();
  for (;;) {
    while (!stop_ && queue_.empty()) {
      work_cv_.WaitFor(mu_, kForever,
                       [&]() KOLO_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
    }
    if (stop_) {
      queue_.clear();
      idle_cv_.notify_all();
      mu_.unlock();
      return;
    }
    Job job = std::move(queue_.front());
    queue_.pop_front();
    // After a failure nothing more of the step is pushed (the step fails), and nothing is waited
    // for: a copy that failed or hung says the device is in trouble, so later ones may hang too.
    const bool skip = cancel_ || !error_.ok();
    busy_ = true;
    mu_.unlock();
    Status s;
    Handle h;
    if (!skip) {
      s = job.copy->Wait(timeout_);
      if (s.ok()) {
        StatusOr<Handle> pushed = submit_(job.param, job.host);
        if (pushed.ok()) {
          h = *pushed;
        } else {
          s = pushed.status();
        }
      }
      if (!s.ok()) {
        s = s.WithContext(fmt::format("staging the gradient of '{}' for the parameter servers",
                                      job.name != nullptr ? *job.name : "?"));
      }
    }
    job.copy.reset();
    mu_.lock();
    busy_ = false;
    if (!skip) {
      if (s.ok()) {
        submitted_.push_back({job.param, h});
      } else if (error_.ok()) {
        error_ = s;
      }
    }
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

Status GradientStager::Finish(std::vector<Submitted>* submitted) {
  MutexLock lock(mu_);
  Status deadline;
  if (!idle_cv_.WaitFor(mu_, timeout_, [&]() KOLO_REQUIRES(mu_) { return Idle(); })) {
    deadline = DeadlineExceeded(
        "staging gradients for the parameter servers: {} copies still queued after {} ms",
        queue_.size() + (busy_ ? 1 : 0), timeout_.count());
    cancel_ = true;
    work_cv_.notify_all();
    while (!Idle()) idle_cv_.WaitFor(mu_, kForever, [&]() KOLO_REQUIRES(mu_) { return Idle(); });
  }
  Status s = error_.ok() ? deadline : error_;
  *submitted = std::move(submitted_);
  submitted_.clear();
  error_ = Status::OK();
  cancel_ = false;
  return s;
}

}  // namespace kolo::models::trainer
