// kolo-test-needs: CUDNN
// Parameter servers with gradients on a GPU: the trainer stages each device gradient to host
// float32 for the servers and writes the pulled weights back to the device. 2 workers on cuDNN
// and 1 server (as threads, one GPU shared) must train tiny-cnn to the weights of 2 workers over
// the ring, in strict fp32 and, with a looser bound, in fp16 mixed precision (float32 master
// values on the servers). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <memory>

#include "models/compute/backend.h"
#include "models/compute/cudnn/cudnn_backend.h"
#include "tests/models/trainer_test_util.h"

namespace kolo::models::trainer {
namespace {

using compute::Precision;

StatusOr<std::unique_ptr<compute::ComputeBackend>> MakeCudnn() {
  return compute::cudnn::CreateCudnnBackend({});
}

TEST(CudnnParameterServerTest, GpuGradientsTrainLikeTheRing) {
  if (compute::cudnn::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device in this process";
  const Graph g = TinyCnn();
  const auto ring = Train(g, 2, 1, 4, 0, MakeCudnn, Precision::kFp32);
  ExpectClose(g, Train(g, 2, 1, 4, 1, MakeCudnn, Precision::kFp32), ring, 1e-4);
}

TEST(CudnnParameterServerTest, MixedPrecisionKeepsFloat32MastersOnTheServers) {
  if (compute::cudnn::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device in this process";
  const Graph g = TinyCnn();
  const auto ring = Train(g, 2, 1, 4, 0, MakeCudnn, Precision::kFp16);
  ExpectClose(g, Train(g, 2, 1, 4, 1, MakeCudnn, Precision::kFp16), ring, 1e-2);
}

}  // namespace
}  // namespace kolo::models::trainer
