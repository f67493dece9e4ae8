// kolo-sim's prediction of kolo-train --autotune: the trainer's coordinate search run on the
// model (docs/autotune.md).
#pragma once

#include <vector>

#include "engine/common/status.h"
#include "models/trainer/run_record.h"
#include "sim/model.h"

namespace kolo::sim {

// kolo-train --autotune's search run on the model: the same coordinate search (fusion threshold
// 4, 16, 64, 128 MiB, then cycle time 0.5, 1, 2.5, 5 ms, then, for the ring backend, the
// allreduce algorithm auto or ring), from `point`'s settings, keeping a value only when its
// prediction is faster. Returns the point with the choice; `trials` gets every predicted trial
// (the point's settings and images/sec), in order.
// A trial as kolo-train's run record keeps it; images_per_sec is the prediction's.
using AutotuneTrialPrediction = models::trainer::AutotuneTrial;
StatusOr<Point> AutotuneChoice(const Point& point, const Calibration& cal,
                               std::vector<AutotuneTrialPrediction>* trials);

}  // namespace kolo::sim
