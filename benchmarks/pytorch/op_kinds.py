"""Operation kinds shared by torch_bench.py --profile and compare_profiles.py: which kind a CUDA
kernel of a PyTorch step belongs to (from its name and the aten ops that launched it), and which
a kolo layer is (from its name, as the model zoo names layers). Pure functions; no torch import.
"""

# Every kind, in report order, with its label.
KINDS = {
    "conv_fwd": "convolution forward",
    "conv_bwd_data": "convolution backward data",
    "conv_bwd_filter": "convolution backward filter",
    "conv_bwd_other": "convolution backward, kernels of unnamed direction (GEMM, layout, bias)",
    "bn_fwd": "batch norm forward",
    "bn_bwd": "batch norm backward",
    "gemm": "matrix product (fully connected)",
    "pool": "pooling",
    "elementwise": "elementwise / activation",
    "concat": "concatenation",
    "loss": "softmax cross-entropy",
    "optimizer": "optimizer",
    "copy": "copies / casts / layout",
    "other": "other",
}


def _conv_direction(k: str) -> str | None:
    """'fwd', 'data' or 'filter' when the lower-cased kernel name says it is a convolution."""
    if "wgrad" in k or "bwd_filter" in k or "backward_filter" in k:
        return "filter"
    if "dgrad" in k or "bwd_data" in k or "backward_data" in k:
        return "data"
    if "fprop" in k or "convolve_sgemm" in k or "scudnn" in k or "conv2d_grouped_direct" in k:
        return "fwd"
    return None


def _has(text: str, *words: str) -> bool:
    return any(w in text for w in words)


def kernel_kind(kernel: str, ops: tuple[str, ...] | list[str] = ()) -> str:
    """The kind (a key of KINDS) of the CUDA kernel named KERNEL; OPS are the names of the
    profiler ranges around its launch (aten ops, autograd nodes, record_function labels), any
    order. OPS decide where the name alone cannot: cuDNN runs some convolutions as plain GEMMs or
    with layout transforms, and a convolution's dgrad may be an fprop kernel on flipped filters."""
    k = kernel.lower()
    op = " ".join(ops).lower()
    conv = _conv_direction(k)
    if "convolution_backward" in op or "convolutionbackward" in op:
        return {"filter": "conv_bwd_filter", "data": "conv_bwd_data", "fwd": "conv_bwd_data"}.get(
            conv, "conv_bwd_other"
        )
    if _has(op, "aten::cudnn_convolution", "aten::_convolution", "aten::conv2d"):
        return "conv_fwd"
    if conv is not None:
        return {"filter": "conv_bwd_filter", "data": "conv_bwd_data", "fwd": "conv_fwd"}[conv]
    if _has(op, "batch_norm", "batchnorm") or _has(k, "bn_fw", "bn_bw", "batch_norm", "batchnorm"):
        backward = _has(k, "bn_bw", "backward", "_bw_") or _has(op, "backward")
        return "bn_bwd" if backward else "bn_fwd"
    if "pool" in op or "pool" in k:
        return "pool"
    if _has(op, "optimizer.step") or _has(
        k, "multi_tensor_apply", "amp_update_scale", "non_finite_check", "sgd"
    ):
        return "optimizer"
    if "aten::cat" in op or "catarraybatchedcopy" in k:
        return "concat"
    if _has(op, "nll_loss", "log_softmax", "cross_entropy") or _has(k, "softmax", "nll_loss"):
        return "loss"
    if _has(k, "gemm", "gemv", "cublas") or _has(op, "aten::addmm", "aten::mm", "aten::linear"):
        return "gemm"
    if _has(k, "memcpy", "memset", "copy_kernel", "nchwtonhwc", "nhwctonchw", "transpose"):
        return "copy"
    if _has(k, "elementwise", "threshold", "clamp", "relu", "dropout", "reduce_kernel", "fill"):
        return "elementwise"
    if _has(op, "aten::add", "aten::mul", "aten::relu", "aten::threshold", "dropout", "aten::fill"):
        return "elementwise"
    return "other"


# torchvision's VGG-16 (configuration "D"): the kinds of features.0, features.1, ... in order.
_VGG16_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
VGG16_FEATURES = [k for c in _VGG16_CFG for k in (["max_pool"] if c == "M" else ["conv", "relu"])]
VGG16_CLASSIFIER = ["fully_connected", "relu", "dropout"] * 2 + ["fully_connected"]


def kolo_layer_kind(name: str) -> str:
    """The kolo layer kind (models/graph LayerKindName: conv, batch_norm, relu, max_pool, avg_pool,
    concat, add, dropout, fully_connected, softmax_cross_entropy, input) of the zoo layer NAME, as
    models/zoo names ResNet, Inception V3 and VGG-16 layers; 'unknown' for a name it cannot place.
    """
    last = name.rsplit(".", 1)[-1]
    if name == "input":
        return "input"
    if last == "loss":
        return "softmax_cross_entropy"
    if name.startswith("features.") and last.isdigit():
        i = int(last)
        return VGG16_FEATURES[i] if i < len(VGG16_FEATURES) else "unknown"
    if name.startswith("classifier.") and last.isdigit():
        i = int(last)
        return VGG16_CLASSIFIER[i] if i < len(VGG16_CLASSIFIER) else "unknown"
    if name.startswith("AuxLogits.conv") and name.count(".") == 1:
        return "relu"  # a BasicConv2d's ReLU carries the BasicConv2d's name (see below)
    if name.endswith("downsample.0") or last == "conv" or (last.startswith("conv") and last[4:].isdigit()):
        return "conv"
    if name.endswith("downsample.1") or last == "bn" or (last.startswith("bn") and last[2:].isdigit()):
        return "batch_norm"
    if last.startswith("relu"):
        return "relu"
    if last == "add":
        return "add"
    if last in ("avgpool", "avg_pool"):
        return "avg_pool"
    if last in ("max_pool", "maxpool") or (last.startswith("maxpool") and last[7:].isdigit()):
        return "max_pool"
    if last == "fc":
        return "fully_connected"
    if last == "dropout":
        return "dropout"
    parts = name.split(".")
    if len(parts) == 2 and parts[0].startswith("layer") and parts[1].isdigit():
        return "relu"  # a ResNet block's output: its last ReLU carries the block's name
    if len(parts) == 1 and name.startswith("Mixed_"):
        return "concat"  # an Inception block's concatenation carries the block's name
    if name.startswith("Conv2d_") or (name.startswith("Mixed_") and len(parts) == 2):
        return "relu"  # a BasicConv2d's ReLU carries the BasicConv2d's name
    return "unknown"


# Where a kolo layer's forward and backward time go among KINDS.
KOLO_KIND_SPLIT = {
    "input": ("copy", "copy"),
    "conv": ("conv_fwd", "conv_bwd"),
    "batch_norm": ("bn_fwd", "bn_bwd"),
    "relu": ("elementwise", "elementwise"),
    "add": ("elementwise", "elementwise"),
    "dropout": ("elementwise", "elementwise"),
    "max_pool": ("pool", "pool"),
    "avg_pool": ("pool", "pool"),
    "concat": ("concat", "concat"),
    "fully_connected": ("gemm", "gemm"),
    "softmax_cross_entropy": ("loss", "loss"),
    "unknown": ("other", "other"),
}

# torch module types whose own kernels are what a kolo layer of that kind does, so that a kolo layer
# and a torchvision module of the same name can be compared (a ResNet block shares its name with
# kolo's last ReLU of the block, but its own kernels are the residual add).
TORCH_TYPES = {
    "conv": {"Conv2d"},
    "batch_norm": {"BatchNorm2d"},
    "relu": {"ReLU", "BasicConv2d"},  # Inception's BasicConv2d applies its ReLU itself
    "max_pool": {"MaxPool2d"},
    "avg_pool": {"AvgPool2d", "AdaptiveAvgPool2d"},
    "dropout": {"Dropout"},
    "fully_connected": {"Linear"},
}
