"""benchmarks/pytorch/compare_profiles.py: kolo's layers grouped by kind against a PyTorch kernel
profile, on a small synthetic pair of profiles, and the kinds of the shipped replay profiles."""

import json
import sys
from collections import Counter

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "pytorch"))
import compare_profiles  # noqa: E402
from op_kinds import KINDS, kolo_layer_kind  # noqa: E402


def layer(name, fwd, bwd):
    return {"name": name, "forward_ms": fwd, "backward_ms": bwd}


KOLO = {
    "format": "kolo-replay-profile",
    "version": 1,
    "model": "resnet101",
    "batch_size": 64,
    "precision": "tf32",
    "update_ms": 1.5,
    "layers": [
        layer("input", 0.125, 0),
        layer("conv1", 2.0, 4.0),
        layer("bn1", 0.5, 1.0),
        layer("relu", 0.25, 0.25),
        layer("maxpool", 0.5, 0.75),
        layer("layer1.0.conv1", 1.0, 2.0),
        layer("layer1.0.bn1", 0.5, 0.5),
        layer("layer1.0.add", 0.25, 0.5),
        layer("layer1.0", 0.25, 0.5),  # the block's last ReLU
        layer("avgpool", 0.125, 0.125),
        layer("fc", 0.25, 0.5),
        layer("loss", 0.0625, 0.0625),
        layer("mystery", 0.375, 0.0),
    ],
}
TORCH_KINDS = dict.fromkeys(KINDS, 0.0) | {
    "conv_fwd": 2.5,
    "conv_bwd_data": 1.0,
    "conv_bwd_filter": 2.0,
    "conv_bwd_other": 0.5,
    "bn_fwd": 0.75,
    "bn_bwd": 1.25,
    "gemm": 0.5,
    "pool": 1.0,
    "elementwise": 1.0,
    "loss": 0.125,
    "optimizer": 1.0,
    "copy": 0.0625,
}
TORCH = {
    "format": "kolo-torch-profile",
    "version": 1,
    "model": "resnet101",
    "batch_size": 64,
    "precision": "tf32",
    "step_time_ms_median": 20.0,
    "kinds_ms": TORCH_KINDS,
    "total_kernel_ms": sum(TORCH_KINDS.values()),
    "modules": [
        {"name": "conv1", "type": "Conv2d", "forward_ms": 1.5, "backward_ms": 2.0},
        {"name": "layer1.0.conv1", "type": "Conv2d", "forward_ms": 1.0, "backward_ms": 1.5},
        {"name": "bn1", "type": "BatchNorm2d", "forward_ms": 0.5, "backward_ms": 1.0},
        {"name": "layer1.0", "type": "Bottleneck", "forward_ms": 0.125, "backward_ms": 0.0},
    ],
}


def rows(result):
    return {r["kind"]: (r["kolo_ms"], r["torch_ms"], r["diff_ms"]) for r in result["rows"]}


def test_groups_kolo_layers_and_pytorch_kinds():
    result = compare_profiles.compare(KOLO, TORCH)
    got = rows(result)
    assert got["conv_fwd"] == (3.0, 2.5, 0.5)
    assert got["conv_bwd"] == (6.0, 3.5, 2.5)  # PyTorch's data + filter + other
    assert got["bn_fwd"] == (1.0, 0.75, 0.25)
    assert got["bn_bwd"] == (1.5, 1.25, 0.25)
    assert got["pool"] == (1.5, 1.0, 0.5)  # max and average pooling, forward and backward
    assert got["elementwise"] == (2.0, 1.0, 1.0)  # relu, add and the block's ReLU
    assert got["gemm"] == (0.75, 0.5, 0.25)
    assert got["loss"] == (0.125, 0.125, 0.0)
    assert got["optimizer"] == (1.5, 1.0, 0.5)
    assert got["copy"] == (0.125, 0.0625, 0.0625)
    assert got["other"] == (0.375, 0.0, 0.375)
    assert got["concat"] == (0.0, 0.0, 0.0)
    assert result["unknown_layers"] == ["mystery"]
    kolo_total = sum(lay["forward_ms"] + lay["backward_ms"] for lay in KOLO["layers"]) + 1.5
    assert result["total"]["kolo_ms"] == pytest.approx(kolo_total) == 17.875
    assert result["total"]["torch_ms"] == pytest.approx(11.6875)
    assert result["total"]["diff_ms"] == pytest.approx(kolo_total - 11.6875)
    assert result["torch_conv_bwd"] == {"conv_bwd_data": 1.0, "conv_bwd_filter": 2.0, "conv_bwd_other": 0.5}


def test_layers_are_matched_by_name_and_kind_largest_difference_first():
    result = compare_profiles.compare(KOLO, TORCH, top_layers=2)
    # layer1.0 is kolo's ReLU but PyTorch's Bottleneck (its own kernels are the add): not matched.
    assert [(r["name"], r["diff_ms"]) for r in result["layers"]] == [("conv1", 2.5), ("layer1.0.conv1", 0.5)]
    assert result["layers"][0] | {} == {
        "name": "conv1",
        "kind": "conv",
        "kolo_fwd_ms": 2.0,
        "kolo_bwd_ms": 4.0,
        "torch_fwd_ms": 1.5,
        "torch_bwd_ms": 2.0,
        "diff_ms": 2.5,
    }
    names = [r["name"] for r in compare_profiles.compare(KOLO, TORCH)["layers"]]
    assert names == ["conv1", "layer1.0.conv1", "bn1"]


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    kolo, torch, out = tmp_path / "kolo.json", tmp_path / "torch.json", tmp_path / "cmp.json"
    kolo.write_text(json.dumps(KOLO))
    torch.write_text(json.dumps(TORCH))
    assert compare_profiles.main([str(kolo), str(torch), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "includes launch overhead" in text and "sum of CUDA kernel times" in text
    assert "| kind | kolo ms/step | PyTorch ms/step | kolo − PyTorch |" in text
    assert "| convolution backward (data + filter) | 6.000 | 3.500 | +2.500 |" in text
    assert "| other | 0.375 | 0.000 | +0.375 |" in text
    assert "| **total** | 17.875 | 11.688 | +6.188 |" in text
    assert "mystery" in text
    saved = json.loads(out.read_text())
    assert saved["total"]["diff_ms"] == pytest.approx(17.875 - 11.6875)
    assert rows(saved) == rows(compare_profiles.compare(KOLO, TORCH))


def test_marked_profiles_show_the_host_issue_time_and_the_step(tmp_path, capsys):
    marked = KOLO | {
        "timing": "marks",
        "step_ms": 25.0,
        "layers": [lay | {"forward_issue_ms": 0.0625, "backward_issue_ms": 0.125} for lay in KOLO["layers"]],
    }
    result = compare_profiles.compare(marked, TORCH)
    issue = {r["kind"]: r["kolo_issue_ms"] for r in result["rows"]}
    assert issue["conv_fwd"] == 0.125 and issue["conv_bwd"] == 0.25  # conv1 and layer1.0.conv1
    assert result["kolo_issue_ms"] == pytest.approx(13 * 0.1875)
    assert result["kolo_timing"] == "marks" and result["kolo_step_ms"] == 25.0
    kolo = tmp_path / "kolo.json"
    torch = tmp_path / "torch.json"
    kolo.write_text(json.dumps(marked))
    torch.write_text(json.dumps(TORCH))
    assert compare_profiles.main([str(kolo), str(torch)]) == 0
    text = capsys.readouterr().out
    assert "device time between events" in text and "includes launch overhead" not in text
    assert "| convolution forward | 3.000 | 2.500 | +0.500 | 0.125 |" in text
    assert "kolo timed step (wall, median, while profiling): 25.000 ms." in text
    # A profile without issue times has no such column.
    assert "kolo_issue_ms" not in compare_profiles.compare(KOLO, TORCH)["rows"][0]


def test_cli_refuses_a_file_of_the_wrong_format(tmp_path, capsys):
    kolo, torch = tmp_path / "kolo.json", tmp_path / "torch.json"
    kolo.write_text(json.dumps(KOLO))
    torch.write_text(json.dumps(KOLO))
    assert compare_profiles.main([str(kolo), str(torch)]) == 2
    assert "expected 'kolo-torch-profile'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("input", "input"),
        ("layer2.0.downsample.0", "conv"),
        ("layer2.0.downsample.1", "batch_norm"),
        ("layer2.0.relu3", "relu"),
        ("layer2.0", "relu"),
        ("layer3.5.add", "add"),
        ("Mixed_6b.branch7x7_2.conv", "conv"),
        ("Mixed_6b.branch7x7_2.bn", "batch_norm"),
        ("Mixed_6b.branch7x7_2", "relu"),
        ("Mixed_6b", "concat"),
        ("Mixed_6a.max_pool", "max_pool"),
        ("Mixed_6b.avg_pool", "avg_pool"),
        ("AuxLogits.conv1.conv", "conv"),
        ("AuxLogits.conv1", "relu"),
        ("AuxLogits.loss", "softmax_cross_entropy"),
        ("maxpool2", "max_pool"),
        ("features.28", "conv"),
        ("features.29", "relu"),
        ("features.30", "max_pool"),
        ("classifier.5", "dropout"),
        ("classifier.6", "fully_connected"),
    ],
)
def test_kolo_layer_kind(name, kind):
    assert kolo_layer_kind(name) == kind


@pytest.mark.parametrize(
    ("model", "counts"),
    [
        ("resnet101", {"conv": 104, "batch_norm": 104, "relu": 100, "add": 33, "max_pool": 1, "avg_pool": 1}),
        (
            "inception3",
            {"conv": 96, "batch_norm": 96, "relu": 96, "concat": 11, "max_pool": 4, "avg_pool": 12},
        ),
        ("vgg16", {"conv": 13, "relu": 15, "max_pool": 5, "fully_connected": 3, "dropout": 2}),
    ],
)
def test_every_layer_of_the_shipped_profiles_has_a_kind(model, counts):
    profile = json.loads((ROOT / "models" / "profiles" / f"{model}-h100-b64.json").read_text())
    got = Counter(kolo_layer_kind(lay["name"]) for lay in profile["layers"])
    assert "unknown" not in got
    assert {k: got[k] for k in counts} == counts
