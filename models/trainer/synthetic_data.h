// Synthetic ImageNet-shaped input, generated once per rank before training (no input pipeline in
// the timed loop), the way benchmark harnesses measure training throughput.
#pragma once

#include <cstdint>
#include <vector>

#include "models/graph/graph.h"
#include "models/trainer/trainer.h"

namespace kolo::models::trainer {

// `count` micro-batches of `batch` images of `shape`: pixels drawn from a standard normal
// truncated to [-2, 2] (already-normalised images), labels uniform in [0, num_classes). The
// stream depends only on (seed, rank, micro-batch index), so every rank trains on different data
// and a run is reproducible. REQUIRES: batch > 0, count > 0, num_classes > 0.
std::vector<Batch> MakeSyntheticBatches(const ImageShape& shape, int64_t batch, int count,
                                        int64_t num_classes, uint64_t seed, int rank);

}  // namespace kolo::models::trainer
