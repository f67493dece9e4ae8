// The cudnn compute backend (see models/compute/backend.h).
#pragma once

#include <memory>

#include "models/compute/backend.h"

namespace kolo::models::compute::cudnn {

std::unique_ptr<ComputeBackend> CreateCudnnBackend();

}  // namespace kolo::models::compute::cudnn
