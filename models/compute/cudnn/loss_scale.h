// Dynamic loss scaling of fp16 mixed precision, with torch.cuda.amp.GradScaler's defaults: the
// loss gradient is seeded with `scale`; a step whose gradients hold an inf or NaN is skipped and
// the scale multiplied by backoff_factor; after growth_interval consecutive good steps the scale
// is multiplied by growth_factor (kept when the product is finite).
//
// The state lives in device memory and is advanced by a one-thread kernel at the end of each step
// (no host synchronisation); the rule itself is this header's AdvanceLossScale, shared by that
// kernel and the host (tests), so both apply exactly the same policy. Usable from C++17 device
// code: no kolo headers beyond the standard ones.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KOLO_HOST_DEVICE __host__ __device__
#else
#define KOLO_HOST_DEVICE
#endif

namespace kolo::models::compute::cudnn {

struct LossScaleOptions {
  float init_scale = 65536.0f;     // 2^16
  float growth_factor = 2.0f;      // > 1
  float backoff_factor = 0.5f;     // in (0, 1)
  int32_t growth_interval = 2000;  // good steps between growths; >= 1
};

// One backend's loss-scaling state (device memory; read back with ReadLossScale).
struct LossScaleState {
  float scale = 1.0f;
  int32_t good_steps = 0;     // consecutive good steps since the last growth or backoff
  int32_t found_inf = 0;      // nonzero: a gradient of the current step holds an inf or NaN
  int32_t skipped_steps = 0;  // steps skipped since Prepare
};

inline LossScaleState InitialLossScale(const LossScaleOptions& o) {
  LossScaleState s;
  s.scale = o.init_scale;
  return s;
}

// Ends a step: backs off (and counts a skipped step) when found_inf is set, otherwise counts a
// good step and grows on the interval's last one; clears found_inf for the next step.
KOLO_HOST_DEVICE inline void AdvanceLossScale(const LossScaleOptions& o, LossScaleState* s) {
  if (s->found_inf != 0) {
    s->scale *= o.backoff_factor;
    s->good_steps = 0;
    ++s->skipped_steps;
  } else if (++s->good_steps >= o.growth_interval) {
    const float grown = s->scale * o.growth_factor;
    // False for +inf and NaN: a scale that would overflow float stays where it is.
    if (grown <= 3.402823466e38f) s->scale = grown;
    s->good_steps = 0;
  }
  s->found_inf = 0;
}

// Whether `o` is usable: fills `why` (when given) with what is wrong.
inline bool LossScaleOptionsValid(const LossScaleOptions& o, const char** why = nullptr) {
  const char* error = nullptr;
  if (!(o.init_scale >= 1.0f && o.init_scale <= 3.402823466e38f)) {
    error = "init_scale must be a finite value >= 1";
  } else if (!(o.growth_factor > 1.0f && o.growth_factor <= 65536.0f)) {
    error = "growth_factor must lie in (1, 65536]";
  } else if (!(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f)) {
    error = "backoff_factor must lie in (0, 1)";
  } else if (o.growth_interval < 1) {
    error = "growth_interval must be >= 1";
  }
  if (why != nullptr) *why = error;
  return error == nullptr;
}

}  // namespace kolo::models::compute::cudnn
