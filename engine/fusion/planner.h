// Tensor Fusion planning: which consecutive ready allreduces share one fusion buffer.
//
// Every rank plans from the same ordered response list with the same threshold, so every rank
// arrives at the same groups without further communication.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/coordinator/message.h"

namespace kolo::fusion {

// A run of responses executed by one backend call. `begin`/`end` index the response list.
struct Group {
  size_t begin = 0;
  size_t end = 0;
  size_t bytes = 0;    // total payload bytes
  bool fused = false;  // more than one tensor: goes through the fusion buffer; else in place
};

// Groups consecutive allreduce responses of the same dtype and reduce op while their total stays
// within `threshold_bytes`. A tensor larger than the threshold, every non-allreduce response and
// every error response forms a group of its own. threshold 0 disables fusion (every tensor alone,
// in place).
std::vector<Group> PlanFusion(const std::vector<coordinator::Response>& responses,
                              size_t threshold_bytes);

}  // namespace kolo::fusion
