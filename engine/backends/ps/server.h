// The server side of the parameter-server baseline: holds its share of the variables, sums the
// workers' pushes as they stream in, applies SGD once all W have arrived for a step, and sends the
// new values to every worker.
//
// A push arrives as a header, the variable's initial value (worker 0's first push only) and the
// gradient in chunks of the job's chunk size; each chunk is received into one of two staging
// slots per worker and added to the shard's sum while the next one arrives, so a server needs
// 2 chunks of staging per worker, not a copy of every gradient. Synchronous: a shard's update
// for step t happens once every worker has pushed it for step t, never earlier.
//
// Timeline (track = variable name): PS_SERVER_WAIT from a shard's first push of a step until its
// last push has arrived; PS_UPDATE while SGD runs. Server j writes the timeline of rank W + j.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/ps/job.h"
#include "engine/backends/ps/placement.h"
#include "engine/backends/ps/types.h"
#include "engine/backends/ps/wire.h"
#include "engine/timeline/timeline.h"

namespace kolo::backends::ps {

class Server {
 public:
  // REQUIRES: job.role == Role::kServer. `timeline` (may be null) must outlive the Server.
  Server(Job job, timeline::Timeline* timeline);

  // Serves until every worker has said goodbye (OK) or the first failure: a peer lost or
  // aborted, a protocol violation, a worker that leaves while others wait for its push, a step
  // stalled past KOLO_STALL_SHUTDOWN_SECONDS, a step that has waited the peer timeout on a worker
  // silent for as long (stopped, hung or unreachable: Device::SilentSeconds). A server that was
  // itself stopped restarts its waits when it runs again, and blames no worker for that. On failure
  // the job's device is aborted, so every worker fails too, and the error names this server and the
  // peer. Callable once; not thread-safe.
  Status Serve();

  // Payload bytes exchanged with the workers, and shard updates applied; readable from any thread.
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }
  int64_t updates() const { return updates_.load(); }

 private:
  enum class Slot : uint8_t { kHeader, kRegistration, kInit, kChunk };
  struct RecvSlot {
    Slot kind = Slot::kHeader;
    int shard = -1;      // local shard index
    size_t chunk = 0;    // kChunk: chunk index within the push
    size_t bytes = 0;    // expected length
    size_t staging = 0;  // kChunk: staging slot (0 or 1)
  };
  // Per worker.
  struct Peer {
    int rank = 0;
    std::deque<RecvSlot> recvs;
    std::vector<uint8_t> registration;
    std::unique_ptr<transport::Region> registration_region;
    bool registered = false;
    bool gone = false;  // said goodbye
    // The push being received: chunks posted so far and in total.
    int push_shard = -1;
    size_t chunks_posted = 0;
    size_t chunks_total = 0;
    int chunks_outstanding = 0;
  };
  // One shard this server holds.
  struct ShardState {
    int id = 0;  // shard id on the wire
    std::string name;
    size_t count = 0;
    std::vector<float> weights, momentum, sum;
    std::unique_ptr<transport::Region> weights_region;
    uint64_t step = 0;
    bool initialized = false;
    int announced = 0;         // workers whose push header of this step arrived
    int arrived = 0;           // workers whose whole push of this step has been summed
    std::vector<bool> pushed;  // per worker: header of this step seen
    std::vector<bool> summed;  // per worker: whole push of this step summed
    SgdSettings sgd;           // the first push's settings; every worker's must match
    std::chrono::steady_clock::time_point wait_start;
    std::chrono::steady_clock::time_point last_warning;
    Header reply;
  };

  Status Loop();
  Status PostHeaderRecv(int worker);
  Status PostChunks(int worker);
  Status OnCompletion(const transport::Completion& c);
  Status OnHeader(int worker);
  Status OnPushHeader(int worker, const Header& h);
  Status OnBye(int worker);
  Status OnPushDone(int worker, ShardState& s);
  Status FinishRegistration();
  Status Update(ShardState& s);
  Status CheckStalls();
  std::string MissingWorkers(const ShardState& s) const;
  // Workers not `done` (and not gone) that have been silent for the peer timeout.
  std::vector<int> SilentWorkers(const std::vector<bool>& done) const;
  std::string DescribeSilent(const std::vector<int>& workers) const;
  // Fails, naming them, when workers that have not registered are silent for the peer timeout.
  Status CheckRegistration();
  std::string Who(int worker) const;

  Job job_;
  timeline::Timeline* const timeline_;
  const int workers_;
  const std::chrono::milliseconds peer_timeout_;
  size_t chunk_bytes_ = 0;
  bool served_ = false;

  Registration registration_;
  Placement placement_;
  bool registered_ = false;
  int registrations_ = 0;
  std::vector<Peer> peers_;         // per worker
  std::vector<ShardState> shards_;  // this server's shards
  std::vector<int> local_;          // shard id -> index in shards_, -1 elsewhere
  std::vector<Header> rx_headers_;  // per worker
  std::unique_ptr<transport::Region> rx_headers_region_;
  std::vector<float> staging_;  // per worker: 2 chunks (of chunk_bytes_ / 4 elements)
  // Compressed pushes: a received chunk cast to float32 before it is summed.
  std::vector<float> widened_;
  std::unique_ptr<transport::Region> staging_region_;
  Header registered_header_;
  std::unique_ptr<transport::Region> registered_region_;
  std::vector<std::unique_ptr<transport::Region>> reply_regions_;  // per local shard
  int64_t pending_sends_ = 0;
  int gone_ = 0;
  std::chrono::steady_clock::time_point last_stall_check_;
  std::vector<transport::Completion> completions_;

  std::atomic<int64_t> bytes_sent_{0}, bytes_received_{0}, updates_{0};
};

}  // namespace kolo::backends::ps
