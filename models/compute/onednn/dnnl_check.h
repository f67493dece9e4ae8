// Conversion of oneDNN failures into kolo Status values. oneDNN's C++ API reports a failed call
// by throwing dnnl::error (its dnnl_status_t and a description); nothing thrown by oneDNN leaves
// this folder.
#pragma once

#include <dnnl.hpp>
#include <string>

#include "engine/common/status.h"

namespace kolo::models::compute::onednn {

// "oneDNN <call> failed for <context>: <what> (dnnl_status_t <code>)". An unimplemented
// primitive (an unsupported shape or layout) is an InvalidArgument, everything else Internal.
Status DnnlError(const std::string& context, const char* call, const dnnl::error& e);

}  // namespace kolo::models::compute::onednn

// Runs `call` (one statement that calls into oneDNN) and returns the converted failure from the
// enclosing Status-returning function if oneDNN throws. `context` names the layer or tensor.
#define KOLO_DNNL_CHECK(context, call)                                                       \
  do {                                                                                       \
    try {                                                                                    \
      call;                                                                                  \
    } catch (const ::dnnl::error& kolo_dnnl_error_) {                                        \
      return ::kolo::models::compute::onednn::DnnlError((context), #call, kolo_dnnl_error_); \
    }                                                                                        \
  } while (0)
