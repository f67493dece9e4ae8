// Deterministic initial parameter values for a Graph, as Parameter::init prescribes: conv and
// fully-connected weights He-normal (normal, mean 0, std sqrt(2 / fan_in), fan_in = the weight's
// elements per output unit: in/groups * kh * kw for a conv, in for a fully-connected layer —
// torch's kaiming_normal_ with mode='fan_in', nonlinearity='relu'), biases and batch-norm beta
// zero, batch-norm gamma one.
//
// The values depend only on (seed, parameter index, parameter numel): each parameter draws from its
// own splitmix64 stream (seeded from both), turned into normals by Box-Muller in double precision
// and rounded to float. No std:: distribution is involved (their output is implementation-defined),
// so every build on every machine with an IEEE double libm (log, sqrt, sin, cos correctly rounded
// or nearly so, as glibc's are) produces the same values. Training still broadcasts rank 0's
// parameters at start, so ranks agree even where a libm differs in a last bit.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "models/graph/graph.h"

namespace kolo::models {

// One vector per parameter of `graph`, in graph.params() order, each of the parameter's numel.
std::vector<std::vector<float>> InitialParameters(const Graph& graph, uint64_t seed);

// The values of one parameter (index `param_index` in its graph) without materialising the others:
// equal to InitialParameters(graph, seed)[param_index]. REQUIRES: out.size() == param.numel.
void InitialParameter(const Parameter& param, int param_index, uint64_t seed, std::span<float> out);

}  // namespace kolo::models
