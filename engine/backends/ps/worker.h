// The worker side of the parameter-server baseline: pushes gradients to the servers that hold
// each variable the moment the trainer submits them, and pulls the updated values back.
//
// One thread per worker drives the job's device (Job::device): it takes submissions from a queue
// (waking the device so that a push never waits for a poll to time out), posts the sends of every
// push at once (the transport writes them in order as the socket drains), and receives the
// servers' replies in whatever order the servers finish. A variable's handle completes when every
// one of its shards has been pushed and pulled.
//
// Errors: the thread's first failure (a server or another rank lost or aborted, a protocol
// violation, a server this worker waits on silent for the peer timeout) is fatal: it aborts the
// job's device (every peer then fails, naming this worker) and reports the error, naming the peer,
// through FailFn; every pending and later PushPull fails with it.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/backends/ps/job.h"
#include "engine/backends/ps/placement.h"
#include "engine/backends/ps/types.h"
#include "engine/backends/ps/wire.h"
#include "engine/common/mutex.h"
#include "engine/common/thread_annotations.h"
#include "engine/timeline/timeline.h"

namespace kolo::backends::ps {

class Worker {
 public:
  // Called on the worker's thread when a PushPull completes (OK, or its failure).
  using CompleteFn = std::function<void(int64_t handle, const Status& status)>;
  // Called once, on the worker's thread, with the first fatal error (before the PushPulls it
  // fails are completed).
  using FailFn = std::function<void(const Status& status)>;

  // Takes the job's device and starts the thread. `timeline` (may be null) must outlive the
  // Worker. REQUIRES: job.role == Role::kWorker.
  Worker(Job job, CompleteFn complete, FailFn fail, timeline::Timeline* timeline);
  // Shuts down as Shutdown does.
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // See Engine::RegisterVariables. Waits at most the peer timeout for every server's answer.
  Status RegisterVariables(const std::vector<VariableSpec>& vars) KOLO_EXCLUDES(mu_);
  // Validates and queues one PushPull (Engine::PushPullAsync) whose completion is reported with
  // `handle` through CompleteFn. Errors (nothing queued): unregistered name, dtype or shape
  // other than registered, the variable already in flight, a failed or stopped worker.
  Status PushPull(int64_t handle, const std::string& name, const void* grad, void* weights,
                  DataType dtype, const Shape& shape, const SgdSettings& sgd) KOLO_EXCLUDES(mu_);
  // Tells every server this worker is done, stops the thread and closes the device. PushPulls
  // still in flight fail with "shut down". Returns the fatal error, if any. Idempotent.
  Status Shutdown() KOLO_EXCLUDES(shutdown_mu_, mu_);

  // Payload bytes exchanged with the servers, and completed PushPulls.
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }
  int64_t updates() const { return updates_.load(); }
  // Time during which at least one PushPull was in flight (pushed and not yet pulled), in
  // microseconds: the worker's communication time, overlapped with the caller's work or not.
  double busy_us() const { return static_cast<double>(busy_ns_.load()) / 1e3; }
  // The placement, once RegisterVariables has returned OK.
  const Placement& placement() const { return placement_; }

 private:
  struct Request {
    int var = 0;
    int64_t handle = 0;
    const void* grad = nullptr;
    void* weights = nullptr;
    SgdSettings sgd;
  };
  // What a posted operation on one server's pair is, in posting order (a pair completes its sends
  // in order, and its receives in order).
  struct SendSlot {
    int var = -1;       // -1: registration or bye
    bool last = false;  // the last message of this push to this server for one shard
  };
  struct RecvSlot {
    int shard = -1;  // -1: a header
    size_t bytes = 0;
  };
  // Background-thread state of one variable.
  struct Variable {
    VariableSpec spec;
    uint64_t step = 0;  // completed PushPulls
    int64_t handle = -1;
    int pending_sends = 0;  // shards whose push is not yet written
    int pending_pulls = 0;  // shards whose new value has not arrived
    bool pulling = false;   // timeline: PS_PULL open
    const void* grad_ptr = nullptr;
    void* weights_ptr = nullptr;
    std::unique_ptr<transport::Region> grad_region, weights_region;
    // Compression: the gradient cast to the push dtype, sent from here (allocated and registered
    // at the first push).
    std::vector<uint16_t> wire;
    std::unique_ptr<transport::Region> wire_region;
  };

  void Run() KOLO_EXCLUDES(mu_);
  Status Loop() KOLO_EXCLUDES(mu_);
  Status SendRegistration();
  Status StartPush(const Request& r);
  Status PostHeaderRecv(int server);
  // Fails, naming the server, when a server this worker waits on has been silent for the peer
  // timeout (Device::SilentSeconds).
  Status CheckServers(bool registration_sent);
  Status OnCompletion(const transport::Completion& c) KOLO_EXCLUDES(mu_);
  Status OnHeader(int server) KOLO_EXCLUDES(mu_);
  void MaybeComplete(Variable& v) KOLO_EXCLUDES(mu_);
  void FailInFlight(const Status& status) KOLO_EXCLUDES(mu_);
  // One PushPull fewer in flight; adds the busy period to busy_ns_ when none is left.
  void EndBusy();
  void UpdateCounters();

  Job job_;
  const CompleteFn complete_;
  const FailFn fail_;
  timeline::Timeline* const timeline_;
  const size_t chunk_bytes_;
  // The dtype gradients travel in (Options::compression).
  DataType push_dtype_ = DataType::kFloat32;
  const std::chrono::milliseconds peer_timeout_;

  // Lock order: shutdown_mu_, then mu_. mu_ is never held across communication or callbacks.
  Mutex mu_;
  CondVar cv_;
  std::deque<Request> queue_ KOLO_GUARDED_BY(mu_);
  std::unordered_map<std::string, int> index_ KOLO_GUARDED_BY(mu_);  // name -> variable
  std::vector<VariableSpec> specs_ KOLO_GUARDED_BY(mu_);
  std::vector<bool> in_flight_ KOLO_GUARDED_BY(mu_);
  bool registering_ KOLO_GUARDED_BY(mu_) = false;          // registration queued
  std::optional<Status> registered_ KOLO_GUARDED_BY(mu_);  // the servers' answer
  bool stop_ KOLO_GUARDED_BY(mu_) = false;
  bool stopped_ KOLO_GUARDED_BY(mu_) = false;  // the thread has ended
  Status fatal_ KOLO_GUARDED_BY(mu_);
  // Started by the constructor, joined by Shutdown (the destructor's too) under shutdown_mu_.
  std::thread thread_ KOLO_GUARDED_BY(shutdown_mu_);
  Mutex shutdown_mu_;  // serialises Shutdown callers (taken before mu_)

  // Set by RegisterVariables (under mu_) before the registration is queued, read-only afterwards:
  // the thread, and RegisterVariables once registered, read them without mu_. Not guarded.
  Placement placement_;
  Registration registration_;

  // Background thread only.
  std::vector<Variable> vars_;
  std::vector<Header> push_headers_;  // one per shard
  std::unique_ptr<transport::Region> push_headers_region_;
  std::vector<Header> rx_headers_;  // one per server
  std::unique_ptr<transport::Region> rx_headers_region_;
  std::vector<Header> control_headers_;  // register, bye
  std::unique_ptr<transport::Region> control_region_;
  std::vector<uint8_t> registration_text_;
  std::unique_ptr<transport::Region> registration_region_;
  std::vector<std::deque<SendSlot>> sends_;  // per server
  std::vector<std::deque<RecvSlot>> recvs_;  // per server
  std::vector<bool> acked_;                  // per server: registration accepted
  std::vector<int> pulls_due_;               // per server: shard values not yet pulled
  std::chrono::steady_clock::time_point last_turn_{};
  std::vector<transport::Completion> completions_;

  std::atomic<int64_t> bytes_sent_{0}, bytes_received_{0}, updates_{0};
  // The worker thread's own: PushPulls between StartPush and completion, and since when the
  // worker has had one in flight.
  int active_ = 0;
  std::chrono::steady_clock::time_point busy_since_;
  std::atomic<int64_t> busy_ns_{0};
};

}  // namespace kolo::backends::ps
