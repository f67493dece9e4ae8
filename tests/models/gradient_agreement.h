// Judging one backend's gradients against a reference's, for the GPU backend tests: relative
// errors per tensor and overall, with an allowance for how much the reference itself moves when
// its input is perturbed slightly (its sensitivity).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "models/graph/graph.h"

namespace kolo::models::compute {

using Grads = std::vector<std::vector<float>>;  // graph.params() order

inline double Norm(const std::vector<float>& a) {
  double s = 0;
  for (float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

struct GradErrors {
  double total = 0;
  std::vector<double> per_tensor;
};

// Relative errors of `got` against `want`. Tensors whose gradient is tiny next to the model's (a
// bias right before batch norm, whose exact gradient is zero) are judged against a floor of 1e-3
// of the whole gradient's norm.
inline GradErrors CompareGradients(const Grads& got, const Grads& want) {
  double total = 0, total_diff = 0;
  for (const auto& w : want) total += Norm(w) * Norm(w);
  total = std::sqrt(total);
  GradErrors e;
  for (size_t p = 0; p < want.size(); ++p) {
    double d = 0;
    for (size_t i = 0; i < want[p].size(); ++i) {
      const double x = static_cast<double>(got[p][i]) - want[p][i];
      d += x * x;
    }
    total_diff += d;
    e.per_tensor.push_back(std::sqrt(d) / std::max(Norm(want[p]), 1e-3 * total));
  }
  e.total = total > 0 ? std::sqrt(total_diff) / total : 0;
  return e;
}

struct Tolerance {
  double loss;
  double total;       // all gradients as one vector
  double per_tensor;  // each gradient tensor
  // > 0: also allow kSensitivityFactor times the gradient error that this relative perturbation
  // of the input causes in the reference alone.
  double input_noise = 0;
};
inline constexpr double kSensitivityFactor = 4;

struct WorstTensor {
  double error = 0;
  std::string name;
};

// Expects every tensor's error and the overall error within `tol`, or within kSensitivityFactor
// times the reference's own sensitivity where that is larger. `label` names the configuration in
// failure messages. Returns the worst tensor, for the caller's report.
inline WorstTensor ExpectGradientsAgree(const Graph& g, const GradErrors& e,
                                        const GradErrors& sensitivity, const Tolerance& tol,
                                        const std::string& label) {
  WorstTensor worst;
  for (size_t p = 0; p < e.per_tensor.size(); ++p) {
    const double limit = std::max(tol.per_tensor, kSensitivityFactor * sensitivity.per_tensor[p]);
    EXPECT_LE(e.per_tensor[p], limit)
        << g.name() << " gradient " << g.params()[p].name << " (" << label << ")";
    if (e.per_tensor[p] > worst.error) worst = {e.per_tensor[p], g.params()[p].name};
  }
  EXPECT_LE(e.total, std::max(tol.total, kSensitivityFactor * sensitivity.total))
      << g.name() << " all gradients (" << label << ")";
  return worst;
}

}  // namespace kolo::models::compute
