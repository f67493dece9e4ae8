#include "engine/common/tensor.h"

namespace kolo {

const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "average"; }

}  // namespace kolo
