#include "engine/backends/ps/sgd.h"

namespace kolo::backends::ps {

void ApplySgd(float* w, float* v, float* sum, size_t count, int workers, const SgdSettings& s) {
  // Folding the average into the scale saves a multiply per element; float32 rounding then
  // differs from "divide, then scale" by at most an ulp, well inside any comparison's tolerance.
  const float scale = static_cast<float>(s.grad_scale / workers);
  const float wd = static_cast<float>(s.weight_decay);
  const float mom = static_cast<float>(s.momentum);
  const float lr = static_cast<float>(s.learning_rate);
  for (size_t i = 0; i < count; ++i) {
    const float g = sum[i] * scale + wd * w[i];
    v[i] = mom * v[i] + g;
    w[i] -= lr * v[i];
    sum[i] = 0.0f;
  }
}

}  // namespace kolo::backends::ps
