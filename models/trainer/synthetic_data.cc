#include "models/trainer/synthetic_data.h"

#include <cmath>
#include <random>

#include "engine/common/random.h"

namespace kolo::models::trainer {
namespace {

// Spreads (seed, rank, index) over the whole state space so that nearby seeds give unrelated
// streams.
uint64_t Mix(uint64_t x) { return SplitMix64(x); }

}  // namespace

std::vector<Batch> MakeSyntheticBatches(const ImageShape& shape, int64_t batch, int count,
                                        int64_t num_classes, uint64_t seed, int rank) {
  std::vector<Batch> out(static_cast<size_t>(count));
  for (int m = 0; m < count; ++m) {
    std::mt19937_64 rng(
        Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(rank)) ^ static_cast<uint64_t>(m)));
    // Box-Muller by hand: std::normal_distribution's sequence differs between standard libraries.
    auto uniform = [&rng] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
    Batch& b = out[static_cast<size_t>(m)];
    b.images.resize(static_cast<size_t>(batch * shape.size()));
    for (float& v : b.images) {
      double z;
      do {
        z = std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
      } while (std::fabs(z) > 2.0);
      v = static_cast<float>(z);
    }
    b.labels.resize(static_cast<size_t>(batch));
    for (int32_t& l : b.labels) {
      l = static_cast<int32_t>(rng() % static_cast<uint64_t>(num_classes));
    }
  }
  return out;
}

}  // namespace kolo::models::trainer
