// Tensor Fusion planning: which ready allreduces share one fusion buffer.
//
// Every rank plans from the same ordered response list with the same threshold, so every rank
// arrives at the same groups, in the same order, without further communication.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/coordinator/message.h"

namespace kolo::fusion {

// Responses executed by one backend call, as indices into the response list.
struct Group {
  std::vector<size_t> members;
  size_t bytes = 0;    // total payload bytes
  bool fused = false;  // more than one tensor: goes through the fusion buffer; else in place
};

// Greedy, in list order: each group starts at the first response not yet planned and takes every
// later allreduce response of the same dtype, reduce op and place (host or device memory: the two
// never share a group) that still fits within
// `threshold_bytes` (skipping over others, which later groups pick up). A tensor larger than the
// threshold, every non-allreduce response and every error response forms a group of its own.
// threshold 0 disables fusion (every tensor alone, in place).
std::vector<Group> PlanFusion(const std::vector<coordinator::Response>& responses,
                              size_t threshold_bytes);

}  // namespace kolo::fusion
