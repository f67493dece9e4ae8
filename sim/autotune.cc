#include "sim/autotune.h"

#include <algorithm>

namespace kolo::sim {

StatusOr<Point> AutotuneChoice(const Point& point, const Calibration& cal,
                               std::vector<AutotuneTrialPrediction>* trials) {
  Point best = point;
  double best_rate = 0;
  auto run = [&](const Point& p, bool baseline) -> Status {
    KOLO_ASSIGN_OR_RETURN(const Prediction r, Predict(p, cal));
    const bool kept = baseline || r.total_images_per_sec > best_rate;
    if (kept) {
      best = p;
      best_rate = r.total_images_per_sec;
    }
    trials->push_back({p.fusion_threshold_mb, p.cycle_time_ms,
                       p.backend == "ring" ? p.allreduce_algorithm : "", p.hierarchical,
                       r.total_images_per_sec, kept});
    return Status::OK();
  };
  KOLO_RETURN_IF_ERROR(run(best, true));
  // Each knob's values but the one it had when its turn came (already predicted).
  const double fusion_before = best.fusion_threshold_mb;
  for (double mb : {4.0, 16.0, 64.0, 128.0}) {
    Point p = best;
    p.fusion_threshold_mb = mb;
    if (mb != fusion_before) KOLO_RETURN_IF_ERROR(run(p, false));
  }
  const double cycle_before = best.cycle_time_ms;
  for (double ms : {0.5, 1.0, 2.5, 5.0}) {
    Point p = best;
    p.cycle_time_ms = ms;
    if (ms != cycle_before) KOLO_RETURN_IF_ERROR(run(p, false));
  }
  if (point.backend == "ring") {
    const std::string algorithm_before = best.allreduce_algorithm;
    for (const char* a : {"auto", "ring"}) {
      Point p = best;
      p.allreduce_algorithm = a;
      if (p.allreduce_algorithm != algorithm_before) KOLO_RETURN_IF_ERROR(run(p, false));
    }
  }
  // Hierarchical allreduce, where kolo-train's search switches it: several hosts with more than
  // one rank each (Engine::CanSwitchHierarchical).
  const int per_host = std::max(1, point.ranks_per_host);
  if (point.backend == "ring" && per_host > 1 && point.ranks > per_host &&
      point.ranks % per_host == 0) {
    Point p = best;
    p.hierarchical = !best.hierarchical;
    if (p.hierarchical && p.allreduce_algorithm != "auto" && p.allreduce_algorithm != "ring") {
      p.allreduce_algorithm = "auto";
    }
    KOLO_RETURN_IF_ERROR(run(p, false));
  }
  return best;
}

}  // namespace kolo::sim
