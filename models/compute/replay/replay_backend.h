// The replay compute backend (see models/compute/backend.h).
#pragma once

#include <memory>

#include "models/compute/backend.h"

namespace kolo::models::compute::replay {

std::unique_ptr<ComputeBackend> CreateReplayBackend();

}  // namespace kolo::models::compute::replay
