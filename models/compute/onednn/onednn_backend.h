// The onednn compute backend (see models/compute/backend.h).
#pragma once

#include <memory>

#include "models/compute/backend.h"

namespace kolo::models::compute::onednn {

std::unique_ptr<ComputeBackend> CreateOneDnnBackend();

}  // namespace kolo::models::compute::onednn
