#include "benchmarks/allreduce_bench/device_control.h"

#include <cstring>
#include <numeric>

#include "engine/collectives/collectives.h"

namespace kolo::bench {
namespace {

class DeviceControl final : public Control {
 public:
  DeviceControl(transport::Device& device, std::chrono::milliseconds timeout) {
    comm_.device = &device;
    comm_.timeout = timeout;
  }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const char* name() const override { return "tcp"; }

  Status Barrier() override { return collectives::Barrier(comm_); }

  StatusOr<std::vector<double>> AllgatherDoubles(const std::vector<double>& mine) override {
    std::vector<size_t> bytes(static_cast<size_t>(size()), mine.size() * sizeof(double));
    KOLO_ASSIGN_OR_RETURN(std::vector<uint8_t> all, Allgatherv(mine.data(), bytes));
    std::vector<double> out(mine.size() * static_cast<size_t>(size()));
    if (!out.empty()) std::memcpy(out.data(), all.data(), all.size());
    return out;
  }

  StatusOr<std::vector<std::string>> AllgatherStrings(const std::string& mine) override {
    KOLO_ASSIGN_OR_RETURN(std::vector<double> lens,
                          AllgatherDoubles({static_cast<double>(mine.size())}));
    std::vector<size_t> bytes;
    for (double l : lens) bytes.push_back(static_cast<size_t>(l));
    KOLO_ASSIGN_OR_RETURN(std::vector<uint8_t> all, Allgatherv(mine.data(), bytes));
    std::vector<std::string> out;
    size_t offset = 0;
    for (size_t b : bytes) {
      out.emplace_back(reinterpret_cast<const char*>(all.data()) + offset, b);
      offset += b;
    }
    return out;
  }

 private:
  // Every rank's `bytes[rank]` bytes from `mine`, concatenated in rank order.
  StatusOr<std::vector<uint8_t>> Allgatherv(const void* mine, const std::vector<size_t>& bytes) {
    const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
    size_t offset = 0;
    for (int r = 0; r < rank(); ++r) offset += bytes[r];
    std::vector<uint8_t> all(std::max<size_t>(total, 1));
    if (bytes[rank()] > 0) std::memcpy(all.data() + offset, mine, bytes[rank()]);
    KOLO_ASSIGN_OR_RETURN(auto region, comm_.device->Register(all.data(), all.size()));
    KOLO_RETURN_IF_ERROR(collectives::RingAllgatherv(comm_, *region, 0, bytes));
    region.reset();
    all.resize(total);
    return all;
  }

  collectives::Comm comm_;
};

}  // namespace

std::unique_ptr<Control> MakeDeviceControl(transport::Device& device,
                                           std::chrono::milliseconds timeout) {
  return std::make_unique<DeviceControl>(device, timeout);
}

}  // namespace kolo::bench
