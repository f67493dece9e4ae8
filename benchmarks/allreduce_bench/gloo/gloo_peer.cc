#include "benchmarks/allreduce_bench/gloo/gloo_peer.h"

#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/socket.h>

#include <climits>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "engine/kernels/reduce.h"

namespace kolo::bench::gloo {
namespace {

// Gloo's rendezvous::Store interface over a kolo Store. Gloo reports failures by exception.
class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(bootstrap::Store& store, std::chrono::milliseconds timeout, std::string prefix)
      : store_(store), timeout_(timeout), kPrefix(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = store_.Set(kPrefix + key, std::vector<uint8_t>(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error("gloo store set: " + s.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_.Get(kPrefix + key, timeout_);
    if (!v.ok()) throw std::runtime_error("gloo store get: " + v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) {
      auto v = store_.Get(kPrefix + key, timeout);
      if (!v.ok()) throw std::runtime_error("gloo store wait: " + v.status().ToString());
    }
  }

 private:
  bootstrap::Store& store_;
  std::chrono::milliseconds timeout_;
  const std::string kPrefix;  // keys of one Gloo context
};

struct Shared {
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
};

void SumBFloat16(uint16_t* x, const uint16_t* y, size_t n) {
  kernels::ReduceSum(DataType::kBFloat16, x, y, n);
}

// Gloo's two algorithm classes, and its newer allreduce() call with the RING algorithm.
enum class Algo { kRing, kRingChunked, kAllreduceRing };

template <typename T>
::gloo::AllreduceOptions::Func SumFunc() {
  if constexpr (std::is_same_v<T, uint16_t>) {  // bfloat16
    return [](void* c, const void* a, const void* b, size_t n) {
      kernels::ReduceSum3(DataType::kBFloat16, c, a, b, n);
    };
  } else {
    return static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::sum<T>);
  }
}

template <typename T>
class GlooRow final : public Backend {
 public:
  GlooRow(std::shared_ptr<Shared> shared, Algo algo, const ::gloo::ReductionFunction<T>* fn,
          DataType dtype, ReduceOp op)
      : shared_(std::move(shared)), algo_(algo), fn_(fn), dtype_(dtype), op_(op) {}

  std::string name() const override {
    switch (algo_) {
      case Algo::kRing:
        return "gloo-ring";
      case Algo::kRingChunked:
        return "gloo-ring-chunked";
      case Algo::kAllreduceRing:
        return "gloo-allreduce";
    }
    return "gloo";
  }
  BackendKind kind() const override { return BackendKind::kGloo; }

  Status Bind(const BenchBuffer& buf, size_t count) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      return InvalidArgument("{}: {} elements exceed Gloo's int count (at most {})", name(), count,
                             INT_MAX);
    }
    buf_ = buf.data;
    count_ = count;
    return Guard("set-up", [&] {
      std::vector<T*> ptrs = {reinterpret_cast<T*>(buf_)};
      const int n = static_cast<int>(count);
      if (algo_ == Algo::kAllreduceRing) {
        // Options (and their buffers) are built per call in RunOnce, as Gloo's callers do.
      } else if (algo_ == Algo::kRing) {
        algorithm_ = std::make_unique<::gloo::AllreduceRing<T>>(shared_->context, ptrs, n, fn_);
      } else {
        algorithm_ =
            std::make_unique<::gloo::AllreduceRingChunked<T>>(shared_->context, ptrs, n, fn_);
      }
    });
  }

  Status RunOnce() override {
    KOLO_RETURN_IF_ERROR(Guard("allreduce", [&] {
      if (algo_ == Algo::kAllreduceRing) {
        ::gloo::AllreduceOptions options(shared_->context);
        options.setAlgorithm(::gloo::AllreduceOptions::Algorithm::RING);
        options.setOutput(reinterpret_cast<T*>(buf_), count_);
        options.setReduceFunction(SumFunc<T>());
        options.setTag(++calls_);
        options.setTimeout(shared_->context->getTimeout());
        ::gloo::allreduce(options);
      } else {
        algorithm_->run();
      }
    }));
    if (op_ == ReduceOp::kAverage) {
      kernels::Scale(dtype_, buf_, count_, 1.0 / shared_->context->size);
    }
    return Status::OK();
  }

  void Unbind() override {
    Guard("tear-down", [&] { algorithm_.reset(); }).IgnoreError();
  }

 private:
  template <typename F>
  Status Guard(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return Unavailable("{} {} of {} elements failed on rank {}: {}", name(), what, count_,
                         shared_->context->rank, e.what());
    }
    return Status::OK();
  }

  std::shared_ptr<Shared> shared_;
  Algo algo_;
  const ::gloo::ReductionFunction<T>* fn_;
  DataType dtype_;
  ReduceOp op_;
  std::unique_ptr<::gloo::Algorithm> algorithm_;
  uint32_t calls_ = 0;  // gloo::allreduce tag: a fresh slot per call
  uint8_t* buf_ = nullptr;
  size_t count_ = 0;
};

template <typename T>
std::vector<std::unique_ptr<Backend>> MakeRows(std::shared_ptr<Shared> shared,
                                               std::shared_ptr<Shared> shared_api,
                                               const ::gloo::ReductionFunction<T>* fn,
                                               const BenchConfig& config) {
  std::vector<std::unique_ptr<Backend>> rows;
  // Gloo's oldest AllreduceRing (unpipelined) only with --gloo-all: with more ranks than cores it
  // takes about a minute per 64 MiB iteration, and it is never Gloo's best.
  if (config.gloo_all) {
    rows.push_back(std::make_unique<GlooRow<T>>(shared, Algo::kRing, fn, config.dtype, config.op));
  }
  rows.push_back(
      std::make_unique<GlooRow<T>>(shared, Algo::kRingChunked, fn, config.dtype, config.op));
  rows.push_back(
      std::make_unique<GlooRow<T>>(shared_api, Algo::kAllreduceRing, fn, config.dtype, config.op));
  return rows;
}

}  // namespace

StatusOr<std::vector<std::unique_ptr<Backend>>> MakeGlooPeers(const BenchConfig& config,
                                                              bootstrap::Store& store,
                                                              const GlooSetup& setup) {
  // Gloo's algorithm classes and its newer allreduce() call each get a context of their own:
  // sharing one, the newer call hangs at 4 ranks.
  auto connect = [&](const std::string& prefix) -> StatusOr<std::shared_ptr<Shared>> {
    auto shared = std::make_shared<Shared>();
    try {
      ::gloo::transport::tcp::attr attr;
      attr.hostname = setup.listen_addr;
      attr.ai_family = AF_INET;
      shared->device = ::gloo::transport::tcp::CreateDevice(attr);
      shared->context = std::make_shared<::gloo::rendezvous::Context>(setup.rank, setup.size);
      shared->context->setTimeout(setup.timeout);
      StoreAdapter adapter(store, setup.timeout, prefix);
      shared->context->connectFullMesh(adapter, shared->device);
    } catch (const std::exception& e) {
      return Unavailable("gloo: rank {} could not connect to the other {} ranks on {}: {}",
                         setup.rank, setup.size - 1, setup.listen_addr, e.what());
    }
    return shared;
  };
  KOLO_ASSIGN_OR_RETURN(auto shared, connect("gloo/"));
  KOLO_ASSIGN_OR_RETURN(auto shared_api, connect("gloo-api/"));
  // The static ReductionFunction<T>::sum objects live for the whole process.
  static const ::gloo::ReductionFunction<uint16_t> kBFloat16Sum(::gloo::CUSTOM, &SumBFloat16);
  switch (config.dtype) {
    case DataType::kFloat32:
      return MakeRows<float>(shared, shared_api, ::gloo::ReductionFunction<float>::sum, config);
    case DataType::kFloat64:
      return MakeRows<double>(shared, shared_api, ::gloo::ReductionFunction<double>::sum, config);
    case DataType::kFloat16:
      return MakeRows<::gloo::float16>(shared, shared_api,
                                       ::gloo::ReductionFunction<::gloo::float16>::sum, config);
    case DataType::kBFloat16:
      return MakeRows<uint16_t>(shared, shared_api, &kBFloat16Sum, config);
    case DataType::kInt32:
      return MakeRows<int32_t>(shared, shared_api, ::gloo::ReductionFunction<int32_t>::sum, config);
    case DataType::kInt64:
      return MakeRows<int64_t>(shared, shared_api, ::gloo::ReductionFunction<int64_t>::sum, config);
    case DataType::kUInt8:
      return MakeRows<uint8_t>(shared, shared_api, ::gloo::ReductionFunction<uint8_t>::sum, config);
  }
  return InvalidArgument("gloo: dtype {} is not supported", DataTypeName(config.dtype));
}

}  // namespace kolo::bench::gloo
