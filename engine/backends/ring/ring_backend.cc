#include <memory>

#include "engine/backends/backend.h"
#include "engine/common/fault_inject.h"

namespace kolo::backends {
namespace {

class RingBackend final : public Backend {
 public:
  RingBackend(collectives::Comm* comm, std::optional<collectives::HostGroups> hierarchical,
              collectives::AllreduceAlgorithm algorithm, int hosts, bool hierarchical_on)
      : comm_(comm),
        hierarchical_(std::move(hierarchical)),
        hierarchical_on_(hierarchical_on && hierarchical_.has_value()),
        algorithm_(algorithm),
        hosts_(hosts) {}
  const char* name() const override { return "ring"; }
  bool Enabled(coordinator::CollectiveType, DataType) const override { return true; }

  Status Allreduce(void* buf, size_t count, DataType dtype) override {
    const size_t bytes = count * DataTypeSize(dtype);
    KOLO_ASSIGN_OR_RETURN(auto region, Register(buf, bytes));
    SlowRingScope slow;
    if (HierarchicalSmall(bytes)) {
      return collectives::HierarchicalSmallAllreduce(*comm_, *hierarchical_, *region, 0, count,
                                                     dtype, scratch_);
    }
    const Algorithm algorithm = Pick(bytes);
    if (algorithm == Algorithm::kRing && hierarchical_on_) {
      return collectives::HierarchicalAllreduce(*comm_, *hierarchical_, *region, 0, count, dtype,
                                                hierarchical_scratch_);
    }
    return collectives::AllreduceWith(algorithm, hosts_, *comm_, *region, 0, count, dtype,
                                      scratch_);
  }
  bool SupportsScattered() const override { return true; }
  Status AllreduceScattered(const std::vector<HostBuffer>& pieces, DataType dtype) override {
    std::vector<std::unique_ptr<transport::Region>> regions;
    std::vector<collectives::Extent> extents;
    size_t bytes = 0;
    for (const HostBuffer& p : pieces) {
      if (p.bytes == 0) continue;
      KOLO_ASSIGN_OR_RETURN(auto region, Register(p.data, p.bytes));
      extents.push_back({region.get(), 0, p.bytes});
      regions.push_back(std::move(region));
      bytes += p.bytes;
    }
    SlowRingScope slow;
    if (HierarchicalSmall(bytes)) {
      return collectives::HierarchicalSmallAllreduce(*comm_, *hierarchical_, extents, dtype,
                                                     scratch_);
    }
    const Algorithm algorithm = Pick(bytes);
    if (algorithm == Algorithm::kRing && hierarchical_on_) {
      return collectives::HierarchicalAllreduce(*comm_, *hierarchical_, extents, dtype,
                                                hierarchical_scratch_);
    }
    return collectives::AllreduceWith(algorithm, hosts_, *comm_, extents, dtype, scratch_);
  }

  Status Broadcast(void* buf, size_t nbytes, int root) override {
    KOLO_ASSIGN_OR_RETURN(auto region, Register(buf, nbytes));
    return collectives::RingBroadcast(*comm_, *region, 0, nbytes, root);
  }
  Status Allgatherv(void* buf, const std::vector<size_t>& bytes_per_rank) override {
    size_t total = 0;
    for (size_t b : bytes_per_rank) total += b;
    KOLO_ASSIGN_OR_RETURN(auto region, Register(buf, total));
    return collectives::RingAllgatherv(*comm_, *region, 0, bytes_per_rank);
  }

  Status SetAllreduceAlgorithm(collectives::AllreduceAlgorithm algorithm) override {
    if (hierarchical_on_ && algorithm != Algorithm::kAuto && algorithm != Algorithm::kRing) {
      return InvalidArgument(
          "allreduce algorithm '{}' cannot run a hierarchical allreduce: allowed are auto, ring",
          collectives::AllreduceAlgorithmName(algorithm));
    }
    algorithm_ = algorithm;
    return Status::OK();
  }
  Status SetHierarchicalAllreduce(bool on) override {
    if (on && !hierarchical_) {
      return FailedPrecondition(
          "hierarchical allreduce cannot be switched on: the engine started without its rings' "
          "connections (Options::hierarchical_switchable on a job of several hosts with the same "
          "number of ranks on each)");
    }
    hierarchical_on_ = on;
    return Status::OK();
  }

 private:
  using Algorithm = collectives::AllreduceAlgorithm;
  // Hierarchical allreduce with the rule's choice and every host's area: small buffers go one-shot
  // within the host, then by recursive doubling across hosts.
  bool HierarchicalSmall(size_t bytes) const {
    return hierarchical_on_ && algorithm_ == Algorithm::kAuto && hierarchical_->area != nullptr &&
           collectives::HierarchicalSmallFits(bytes, static_cast<int>(hierarchical_->local.size()));
  }
  // The algorithm for an allreduce of `bytes`: the one asked for, or the rule's.
  Algorithm Pick(size_t bytes) const {
    if (algorithm_ != Algorithm::kAuto) return algorithm_;
    return collectives::ChooseAllreduceAlgorithm(bytes, comm_->size(), hosts_,
                                                 comm_->host_area != nullptr);
  }

  // A zero-byte tensor still takes part (its peers expect the exchange); it registers an empty
  // Region at a stand-in address, so that no null pointer reaches the transport.
  StatusOr<std::unique_ptr<transport::Region>> Register(void* buf, size_t bytes) {
    if (bytes == 0) return comm_->device->Register(&empty_, 0);
    return comm_->device->Register(buf, bytes);
  }

  collectives::Comm* comm_;
  std::optional<collectives::HostGroups> hierarchical_;
  bool hierarchical_on_;
  Algorithm algorithm_;
  int hosts_;
  collectives::Scratch scratch_;
  collectives::HierarchicalScratch hierarchical_scratch_;
  uint64_t empty_ = 0;
};

}  // namespace

std::unique_ptr<Backend> MakeRingBackend(collectives::Comm* comm,
                                         std::optional<collectives::HostGroups> hierarchical,
                                         collectives::AllreduceAlgorithm algorithm, int hosts,
                                         bool hierarchical_on) {
  return std::make_unique<RingBackend>(comm, std::move(hierarchical), algorithm, hosts,
                                       hierarchical_on);
}

}  // namespace kolo::backends
