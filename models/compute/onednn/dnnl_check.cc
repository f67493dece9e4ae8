#include "models/compute/onednn/dnnl_check.h"

#include <fmt/format.h>

namespace kolo::models::compute::onednn {

Status DnnlError(const std::string& context, const char* call, const dnnl::error& e) {
  const StatusCode code =
      e.status == dnnl_unimplemented ? StatusCode::kInvalidArgument : StatusCode::kInternal;
  if (e.status == dnnl_out_of_memory) {
    return Status(code, fmt::format("oneDNN {} failed for {}: out of memory ({}; dnnl_status_t "
                                    "{}): use a smaller batch or free memory on this host",
                                    call, context, e.what(), static_cast<int>(e.status)));
  }
  return Status(code, fmt::format("oneDNN {} failed for {}: {} (dnnl_status_t {})", call, context,
                                  e.what(), static_cast<int>(e.status)));
}

}  // namespace kolo::models::compute::onednn
