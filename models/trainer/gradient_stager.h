// The trainer's staging thread for parameter servers with device gradients (--ps-staging
// overlap): the training thread starts each gradient's copy to host
// (ComputeBackend::StartGradientCopy) right after its layer's backward and hands the copy here;
// this thread waits for the copies in the order they were added and submits each push the moment
// its copy has landed, while the training thread goes on launching the next layers' backward.
//
// Errors: the first failure of a step (a copy that failed or ran past the timeout, a push the
// engine refused) is sticky: later copies of the step are dropped without being waited for or
// pushed, and Finish returns it.
//
// Thread-safety: Add and Finish are called by one thread (the trainer's); `submit` runs on the
// stager's own thread, so it must be safe to call concurrently with whatever the training thread
// does (the engine's methods are).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/common/mutex.h"
#include "engine/common/status.h"
#include "engine/engine.h"
#include "models/compute/backend.h"

namespace kolo::models::trainer {

class GradientStager {
 public:
  // Starts the push of parameter `param`'s gradient, whose copy in `host` has completed.
  using Submit = std::function<StatusOr<Handle>(int param, const float* host)>;
  struct Submitted {
    int param = -1;
    Handle handle;
  };

  // `timeout` bounds each wait for one copy, and Finish's wait for the thread (see there).
  GradientStager(Submit submit, std::chrono::milliseconds timeout);
  // Stops the thread: queued copies are dropped without waiting; one already being waited for is
  // waited out (bounded by the timeout). Pushes submitted but not taken by Finish are forgotten:
  // call Finish first.
  ~GradientStager();
  GradientStager(const GradientStager&) = delete;
  GradientStager& operator=(const GradientStager&) = delete;

  // Queues the copy of parameter `param` (`name` for errors; must outlive the stager) into
  // `host`, which stays untouched until the push it feeds completes. Starts the thread on first
  // use. Never blocks on the copy.
  void Add(int param, const std::string* name, std::unique_ptr<compute::GradientCopy> copy,
           const float* host);

  // Blocks until every copy added since the last Finish has been pushed or dropped, and moves the
  // pushes submitted meanwhile into *submitted (their handles must be waited on, also after an
  // error). Returns the step's first failure, or DeadlineExceeded when the thread has not
  // finished within the timeout (it then drops what is still queued; at most one more timeout
  // passes before Finish returns). The next step starts clean.
  [[nodiscard]] Status Finish(std::vector<Submitted>* submitted);

 private:
  struct Job {
    int param = -1;
    const std::string* name = nullptr;
    std::unique_ptr<compute::GradientCopy> copy;
    const float* host = nullptr;
  };

  void Loop();
  bool Idle() const KOLO_REQUIRES(mu_) { return queue_.empty() && !busy_; }

  const Submit submit_;
  const std::chrono::milliseconds timeout_;
  Mutex mu_;
  CondVar work_cv_;  // the thread: a job or stop
  CondVar idle_cv_;  // Finish: the thread has nothing left
  std::deque<Job> queue_ KOLO_GUARDED_BY(mu_);
  bool busy_ KOLO_GUARDED_BY(mu_) = false;  // the thread holds a job outside the queue
  bool stop_ KOLO_GUARDED_BY(mu_) = false;
  bool cancel_ KOLO_GUARDED_BY(mu_) = false;  // drop jobs without waiting (Finish's deadline)
  Status error_ KOLO_GUARDED_BY(mu_);
  std::vector<Submitted> submitted_ KOLO_GUARDED_BY(mu_);
  std::thread thread_;  // started by the first Add; touched by the training thread only
};

}  // namespace kolo::models::trainer
