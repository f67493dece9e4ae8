// The control channel over a kolo transport Device (launch by kolo-run, or any launch without
// MPI): kolo's ring collectives, every wait bounded by `timeout`.
#pragma once

#include <chrono>
#include <memory>

#include "benchmarks/allreduce_bench/control.h"
#include "engine/transport/transport.h"

namespace kolo::bench {

// `device` is borrowed (it must outlive the Control) and shared with the `link` row; both are
// driven by the main thread only, one at a time.
std::unique_ptr<Control> MakeDeviceControl(transport::Device& device,
                                           std::chrono::milliseconds timeout);

}  // namespace kolo::bench
