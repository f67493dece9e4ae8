// The update a parameter server applies to one shard (Engine's SgdSettings, torch.optim.SGD math).
#pragma once

#include <cstddef>

#include "engine/backends/ps/types.h"

namespace kolo::backends::ps {

// With g = sum[i] / workers: g' = g * grad_scale + weight_decay * w[i];
// v[i] = momentum * v[i] + g'; w[i] -= learning_rate * v[i]; then sum[i] = 0 for the next step.
// Float32 arithmetic, one pass. REQUIRES: workers >= 1; the arrays hold `count` elements and do
// not overlap.
void ApplySgd(float* w, float* v, float* sum, size_t count, int workers, const SgdSettings& s);

}  // namespace kolo::backends::ps
