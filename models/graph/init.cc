#include "models/graph/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kolo::models {
namespace {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: 53 random bits, never 0 so that log() stays finite.
  double UniformOpenZero() { return (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

void FillNormal(const Parameter& param, SplitMix64& rng, std::span<float> out) {
  const int64_t fan_in =
      param.shape.empty() ? 1 : param.numel / std::max<int64_t>(param.shape[0], 1);
  const double sd = param.init == Parameter::Init::kNormal
                        ? param.init_std
                        : std::sqrt(2.0 / static_cast<double>(std::max<int64_t>(fan_in, 1)));
  size_t i = 0;
  while (i < out.size()) {
    const double radius = std::sqrt(-2.0 * std::log(rng.UniformOpenZero()));
    const double angle = 2.0 * std::numbers::pi * rng.UniformOpenZero();
    out[i++] = static_cast<float>(sd * radius * std::cos(angle));
    if (i < out.size()) out[i++] = static_cast<float>(sd * radius * std::sin(angle));
  }
}

}  // namespace

void InitialParameter(const Parameter& param, int param_index, uint64_t seed,
                      std::span<float> out) {
  switch (param.init) {
    case Parameter::Init::kZeros:
      std::fill(out.begin(), out.end(), 0.0f);
      return;
    case Parameter::Init::kOnes:
      std::fill(out.begin(), out.end(), 1.0f);
      return;
    case Parameter::Init::kHeNormal:
    case Parameter::Init::kNormal: {
      // Mixing the index through one splitmix64 step keeps the streams of neighbouring
      // parameters (and neighbouring seeds) unrelated.
      SplitMix64 mix(seed ^ (static_cast<uint64_t>(param_index) * 0xd1b54a32d192ed03ULL));
      SplitMix64 rng(mix.Next());
      FillNormal(param, rng, out);
      return;
    }
  }
}

std::vector<std::vector<float>> InitialParameters(const Graph& graph, uint64_t seed) {
  std::vector<std::vector<float>> values;
  values.reserve(graph.params().size());
  for (size_t i = 0; i < graph.params().size(); ++i) {
    const Parameter& p = graph.params()[i];
    values.emplace_back(static_cast<size_t>(p.numel));
    InitialParameter(p, static_cast<int>(i), seed, values.back());
  }
  return values;
}

}  // namespace kolo::models
