"""The pure parts of benchmarks/pytorch/torch_bench.py --profile: which kind a CUDA kernel is, the
attribution of kernels to modules, and the per-step summary. No torch needed."""

import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "pytorch"))
import torch_bench  # noqa: E402
from op_kinds import KINDS, kernel_kind  # noqa: E402

# Kernel names as torch.profiler reports them on an H100 (torch 2.11, cuDNN 9.19), shortened.
NAMED = [
    ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x256x32_cudnn", "conv_fwd"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_tf32f32_tf32f32_f32_nhwckrsc_nhwc", "conv_fwd"),
    ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>", "conv_fwd"),
    (
        "sm90_xmma_dgrad_implicit_gemm_indexed_f32f32_tf32f32_f32_nhwckrsc_nhwc_strided_execute",
        "conv_bwd_data",
    ),
    (
        "sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32",
        "conv_bwd_filter",
    ),
    (
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct)",
        "bn_fwd",
    ),
    (
        "void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_fw_tr_1C11_args<float>)",
        "bn_fwd",
    ),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float)", "bn_bwd"),
    ("void cudnn::bn_bw_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_bw_1C11_args<float>)", "bn_bwd"),
    ("void at::native::batch_norm_backward_reduce_kernel<float, float, float, int>(...)", "bn_bwd"),
    ("void at::native::batch_norm_collect_statistics_kernel<InvStd, float, float, float, int>", "bn_fwd"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align4>(Params)", "gemm"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x128x32_warpgroupsize1x1x1_kernel__5x_cublas", "gemm"),
    (
        "void at::native::(anonymous namespace)::max_pool_backward_nchw<float, float, int>(float const*)",
        "pool",
    ),
    ("void at::native::(anonymous namespace)::avg_pool2d_out_cuda_frame<float, float>(int)", "pool"),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
        "elementwise",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, "
        "float, at::native::(anonymous namespace)::threshold_kernel_impl<float>>>",
        "elementwise",
    ),
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
        "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor>>>",
        "elementwise",
    ),
    (
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int>",
        "elementwise",
    ),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, 64>", "concat"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>", "loss"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float>", "loss"),
    (
        "void at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<3>, "
        "at::native::BinaryOpListAlphaFunctor<float, 3, 2, 2>, std::plus<float>, float>",
        "optimizer",
    ),
    ("void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(...)>", "copy"),
    ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("Memset (Device)", "copy"),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>", "copy"),
    ("some_unheard_of_kernel", "other"),
]


@pytest.mark.parametrize(("kernel", "kind"), NAMED)
def test_kernel_kind_from_the_name(kernel, kind):
    assert kernel_kind(kernel) == kind


# The ranges around the launch decide where the name cannot.
CONV_BWD = ("aten::convolution_backward", "autograd::engine::evaluate_function: ConvolutionBackward0")


@pytest.mark.parametrize(
    ("kernel", "ops", "kind"),
    [
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x4_nt_align4>(Params)",
            CONV_BWD,
            "conv_bwd_other",
        ),
        ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc", CONV_BWD, "conv_bwd_data"),
        (
            "sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc",
            CONV_BWD,
            "conv_bwd_filter",
        ),
        ("void cudnn::cnn::reduce_wgrad_nchw_helper<float, float>(void*)", CONV_BWD, "conv_bwd_filter"),
        (
            "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>",
            ("aten::cudnn_convolution", "aten::_convolution", "aten::convolution", "aten::conv2d"),
            "conv_fwd",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
            ("aten::cudnn_convolution",),
            "conv_fwd",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>",
            ("aten::mean", "aten::adaptive_avg_pool2d"),
            "pool",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
            ("aten::add_", "Optimizer.step#SGD.step"),
            "optimizer",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(Params)",
            ("aten::addmm", "aten::linear"),
            "gemm",
        ),
    ],
)
def test_kernel_kind_uses_the_launching_ops(kernel, ops, kind):
    assert kernel_kind(kernel, ops) == kind


def test_attribute_kernel():
    seq_module = {7: "layer1.0.conv1"}
    forward = [
        ("aten::cudnn_convolution", -1),
        ("aten::convolution", 7),
        ("module::layer1.0.conv1", -1),
        ("module::layer1.0", -1),
        ("kolo::step", -1),
    ]
    backward = [
        ("aten::convolution_backward", -1),
        ("autograd::engine::evaluate_function: ConvolutionBackward0", 7),
    ]
    assert torch_bench.attribute_kernel(forward, seq_module) == ("layer1.0.conv1", "forward")
    assert torch_bench.attribute_kernel(backward, seq_module) == ("layer1.0.conv1", "backward")
    assert torch_bench.attribute_kernel([("Optimizer.step#SGD.step", -1)], seq_module) == (None, None)


def event(name, seq=-1, parent=None, kernels=()):
    kernels = [SimpleNamespace(name=n, duration=us) for n, us in kernels]
    return SimpleNamespace(name=name, sequence_nr=seq, cpu_parent=parent, kernels=kernels)


def test_kernel_records_ties_backward_kernels_to_the_forward_module():
    mod = event("module::features.0")
    conv = event("aten::convolution", seq=3, parent=mod)
    cudnn = event("aten::cudnn_convolution", parent=conv, kernels=[("sm90_xmma_fprop_x", 10.0)])
    node = event("autograd::engine::evaluate_function: ConvolutionBackward0", seq=3)
    bwd = event(
        "aten::convolution_backward",
        parent=node,
        kernels=[("sm90_xmma_dgrad_x", 20.0), ("sm90_xmma_wgrad_x", 30.0)],
    )
    step = event("Optimizer.step#SGD.step", kernels=[("multi_tensor_apply_kernel", 5.0)])
    records = torch_bench.kernel_records([mod, conv, cudnn, node, bwd, step])
    assert [(r[0], r[2], r[3], r[4]) for r in records] == [
        ("sm90_xmma_fprop_x", "features.0", "forward", 10.0),
        ("sm90_xmma_dgrad_x", "features.0", "backward", 20.0),
        ("sm90_xmma_wgrad_x", "features.0", "backward", 30.0),
        ("multi_tensor_apply_kernel", None, None, 5.0),
    ]
    assert records[1][1][:2] == ("aten::convolution_backward", node.name)


def test_summarize_profile_per_step_kinds_kernels_and_modules():
    fprop, wgrad = "sm90_xmma_fprop_a", "sm90_xmma_wgrad_b"
    bn_fw, bn_bw = "cudnn::bn_fw_tr_1C11_kernel_NCHW", "cudnn::bn_bw_1C11_kernel_new"
    records = []
    for _ in range(2):  # two steps
        records += [
            (fprop, ("aten::cudnn_convolution",), "conv1", "forward", 1000.0),
            (bn_fw, (), "bn1", "forward", 250.0),
            (bn_bw, (), "bn1", "backward", 500.0),
            (wgrad, CONV_BWD, "conv1", "backward", 1500.0),
            (wgrad, CONV_BWD, "conv1", "backward", 500.0),
            (
                "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>",
                (),
                None,
                "backward",
                40.0,
            ),
            ("multi_tensor_apply_kernel", ("Optimizer.step#SGD.step",), None, None, 100.0),
        ]
    out = torch_bench.summarize_profile(records, steps=2, module_types={"conv1": "Conv2d"}, top=3)
    assert list(out["kinds_ms"]) == list(KINDS)
    assert out["kinds_ms"]["conv_fwd"] == 1.0
    assert out["kinds_ms"]["conv_bwd_filter"] == 2.0
    assert out["kinds_ms"]["bn_fwd"] == 0.25
    assert out["kinds_ms"]["bn_bwd"] == 0.5
    assert out["kinds_ms"]["elementwise"] == 0.04
    assert out["kinds_ms"]["optimizer"] == 0.1
    assert out["kinds_ms"]["pool"] == 0.0
    assert out["total_kernel_ms"] == pytest.approx(3.89)
    assert out["top_kernels"] == [
        {"name": wgrad, "kind": "conv_bwd_filter", "calls": 2.0, "ms": 2.0},
        {"name": fprop, "kind": "conv_fwd", "calls": 1.0, "ms": 1.0},
        {"name": bn_bw, "kind": "bn_bwd", "calls": 1.0, "ms": 0.5},
    ]
    assert out["modules"] == [
        {"name": "conv1", "type": "Conv2d", "forward_ms": 1.0, "backward_ms": 2.0},
        {"name": "bn1", "type": "", "forward_ms": 0.25, "backward_ms": 0.5},
    ]
    assert out["outside_modules_ms"] == {"backward": 0.04, "other": 0.1}


def test_profile_flag_is_optional():
    assert torch_bench.parse_args(["--model", "vgg16"]).profile is None
    assert torch_bench.parse_args(["--model", "vgg16", "--profile", "p.json"]).profile == "p.json"
