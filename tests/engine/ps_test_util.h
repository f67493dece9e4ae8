// A small parameter-server job for tests: variables, per-worker gradients, initial values and a
// reference result computed independently of the engine (plain loops: average the workers'
// gradients as an allreduce would, then the SGD of engine.h's SgdSettings).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kolo::testing {

// A conv-like weight, its bias, a scalar, an empty tensor, and (with `large`) a weight of 1.2 MB,
// above the split policy's 1 MiB, so that split placement cuts it.
inline std::vector<VariableSpec> PsVariables(bool large) {
  std::vector<VariableSpec> v = {{"conv1/weight", DataType::kFloat32, {16, 3, 3, 3}},
                                 {"conv1/bias", DataType::kFloat32, {16}},
                                 {"scale", DataType::kFloat32, {}},
                                 {"empty", DataType::kFloat32, {0, 4}},
                                 {"fc/bias", DataType::kFloat32, {1000}}};
  if (large) v.push_back({"fc/weight", DataType::kFloat32, {300, 1000}});
  return v;
}

// Deterministic values in [-1, 1): a hash of the arguments.
inline float PsHash(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
               (c + 0x2545F4914F6CDD1Dull) * 0x94D049BB133111EBull ^ d * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0);
}

inline float PsGrad(int worker, int step, int var, size_t i) {
  return PsHash(static_cast<uint64_t>(worker) + 1, static_cast<uint64_t>(step) + 7,
                static_cast<uint64_t>(var), i);
}
inline float PsInitial(int var, size_t i) { return PsHash(99, 3, static_cast<uint64_t>(var), i); }

// A learning-rate schedule and a grad scale other than 1, so that per-step settings matter.
inline SgdSettings PsSgd(int step) {
  SgdSettings s;
  s.learning_rate = 0.05 * (step + 1);
  s.momentum = 0.9;
  s.weight_decay = 1e-3;
  s.grad_scale = 0.5;
  return s;
}

// A gradient as it reaches the servers when pushes travel as `push` (compression): rounded to it.
inline float PsPushed(float g, DataType push) {
  if (push == DataType::kFloat16) return HalfToFloat(FloatToHalf(g));
  if (push == DataType::kBFloat16) return BFloat16ToFloat(FloatToBFloat16(g));
  return g;
}

// The weights after `steps` synchronous steps of `workers` workers: each step, the average over
// workers of PsGrad (each rounded to `push` first), then g' = avg * grad_scale + weight_decay * w;
// v = momentum * v + g'; w -= learning_rate * v (v starts at zero).
inline std::vector<std::vector<float>> PsReference(const std::vector<VariableSpec>& vars,
                                                   int workers, int steps,
                                                   DataType push = DataType::kFloat32) {
  std::vector<std::vector<float>> w(vars.size());
  for (size_t v = 0; v < vars.size(); ++v) {
    const size_t n = static_cast<size_t>(NumElements(vars[v].shape));
    std::vector<float> mom(n, 0.0f);
    w[v].resize(n);
    for (size_t i = 0; i < n; ++i) w[v][i] = PsInitial(static_cast<int>(v), i);
    for (int t = 0; t < steps; ++t) {
      const SgdSettings s = PsSgd(t);
      for (size_t i = 0; i < n; ++i) {
        double sum = 0;
        for (int k = 0; k < workers; ++k) {
          sum += PsPushed(PsGrad(k, t, static_cast<int>(v), i), push);
        }
        const float avg = static_cast<float>(sum / workers);
        const float g =
            avg * static_cast<float>(s.grad_scale) + static_cast<float>(s.weight_decay) * w[v][i];
        mom[i] = static_cast<float>(s.momentum) * mom[i] + g;
        w[v][i] -= static_cast<float>(s.learning_rate) * mom[i];
      }
    }
  }
  return w;
}

// "" when `got` matches `want` within float32 tolerance, else the first difference.
inline std::string PsCompare(const std::string& name, const std::vector<float>& got,
                             const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return name + ": " + std::to_string(got.size()) + " elements, expected " +
           std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= 1e-5f + 1e-5f * std::fabs(want[i]))) {
      return name + "[" + std::to_string(i) + "] = " + std::to_string(got[i]) + ", expected " +
             std::to_string(want[i]);
    }
  }
  return "";
}

}  // namespace kolo::testing
