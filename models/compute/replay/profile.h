// A replay profile: the measured time of every layer's forward and backward pass of one model at
// one batch size, recorded by `kolo-train --record-profile FILE` on a real backend and played back
// by the replay backend (`--compute replay --profile FILE`).
//
// File format (JSON, one object):
//   {
//     "format": "kolo-replay-profile",  // identifies the file
//     "version": 1,
//     "model": "resnet101",             // Graph::name() of the recorded model
//     "image_size": 224,                // input height = width
//     "num_classes": 1000,
//     "batch_size": 16,                 // images per micro-batch on the recording rank
//     "precision": "fp32",              // fp32 | tf32 | fp16 | bf16
//     "compute": "onednn",              // the backend that was timed (never "replay")
//     "device": "AMD EPYC",             // GPU name, or the CPU model for CPU backends
//     "kolo_commit": "<git sha>",       // or "unknown"
//     "steps": 5,                       // timed steps the medians are taken over
//     "update_ms": 12.5,                // median time of all parameter updates of one step
//     "timing": "marks",                // optional: how the layer times were taken (below)
//     "step_ms": 80.0,                  // optional: median wall time of the timed steps
//     "layers": [                       // every layer of the graph, in graph order
//       {"name": "conv1", "forward_ms": 1.25, "backward_ms": 2.5,
//        "forward_issue_ms": 0.02, "backward_issue_ms": 0.03}, ...  // issue times optional
//     ]
//   }
// Times are medians over the timed steps, in milliseconds. "marks" (what kolo-train writes):
// the time between a mark after the previous layer's call and one after this layer's
// (ComputeBackend::TimeMark: CUDA events on the compute stream on a GPU, so the device's queue
// stays as full as in an unmarked step and the layers sum to about the step; the host clock
// after a synchronise on a CPU). "synchronised" (profiles written before marks, and the default
// when the field is absent): the host's time around each layer's call with the device
// synchronised after it, which on a GPU adds a launch and a synchronise to every layer (the H100
// profiles of 2026-11-27 sum to 1.3x ResNet-101's measured step). The issue times are the host's
// time inside each call, without waiting for the device: where they exceed the marked time the
// layer was launch-bound. The input layer is listed with the time of its forward (copying the
// batch in) and a backward of zero.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "models/graph/graph.h"

namespace kolo::models::compute::replay {

struct LayerTiming {
  std::string name;
  double forward_ms = 0;
  double backward_ms = 0;
  double forward_issue_ms = -1;  // -1: not recorded
  double backward_issue_ms = -1;
};

struct Profile {
  std::string model;
  int64_t image_size = 0;
  int64_t num_classes = 0;
  int64_t batch_size = 0;
  std::string precision = "fp32";
  std::string compute;
  std::string device;
  std::string kolo_commit = "unknown";
  int64_t steps = 0;
  double update_ms = 0;
  std::string timing = "synchronised";  // "marks" or "synchronised" (see above)
  double step_ms = 0;                   // 0: not recorded
  std::vector<LayerTiming> layers;
};

// Serialises `profile` as the JSON above (indented, one layer a line).
std::string ProfileToJson(const Profile& profile);
// Parses the JSON above. Errors name the field and what was expected; `origin` (a path) prefixes
// them.
StatusOr<Profile> ProfileFromJson(const std::string& text, const std::string& origin);

// Reads / writes a profile file. Errors name the path.
StatusOr<Profile> LoadProfile(const std::string& path);
[[nodiscard]] Status SaveProfile(const Profile& profile, const std::string& path);

// Checks that `profile` was recorded for this graph at this batch size and precision: the same
// model name, input size, the same layers in the same order, the same batch. The error names the
// first mismatch (field, the profile's value and the graph's) and the profile's origin.
[[nodiscard]] Status CheckProfileMatches(const Profile& profile, const Graph& graph, int64_t batch,
                                         const std::string& precision, const std::string& origin);

}  // namespace kolo::models::compute::replay
