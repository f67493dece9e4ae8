// The parameter-server baseline's public types: a rank's role, the variables a worker registers
// and the update the servers apply. engine.h exposes them; everything under backends/ps/ includes
// this header, never engine.h, so that the backend depends only on layers below the engine's API.
#pragma once

#include <cstdint>
#include <string>

#include "engine/common/dtype.h"

namespace kolo {

// Parameter-server jobs (Options::backend == "ps", engine/backends/ps/): each launch rank is
// either a worker (a data-parallel training rank) or a parameter server. Which ranks serve is
// Options::ps_servers / ps_server_ranks (options.h explains the mapping: by default the last K).
enum class Role : uint8_t { kWorker, kServer };

// One trainable variable, as a worker registers it with the parameter servers.
struct VariableSpec {
  std::string name;
  DataType dtype = DataType::kFloat32;
  Shape shape;
};

// The update a parameter server applies to a variable: with g the average over workers of the
// pushed gradients, g' = g * grad_scale + weight_decay * w; v = momentum * v + g';
// w -= learning_rate * v; the momentum v starts at zero (torch.optim.SGD without dampening or
// Nesterov; models/compute/backend.h SgdConfig with grad_scale applied first).
struct SgdSettings {
  double learning_rate = 0.1;
  double momentum = 0.9;
  double weight_decay = 1e-4;
  double grad_scale = 1.0;
};

}  // namespace kolo
