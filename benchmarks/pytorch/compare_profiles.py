#!/usr/bin/env python3
"""Compares a kolo replay profile with a torch_bench.py --profile file, per operation kind.

    compare_profiles.py KOLO_PROFILE TORCH_PROFILE [--json FILE] [--top-layers N]

KOLO_PROFILE is a `kolo-train --record-profile` file (models/compute/replay/profile.h): per-layer
forward and backward times. With "timing": "marks" they are the device time between CUDA events
after consecutive layers (idle gaps included where the host issued a layer more slowly than the
GPU ran it), with the host's time issuing each layer beside them; older profiles ("synchronised")
timed each layer on the host with the device synchronised after it, launch and synchronise
included. TORCH_PROFILE holds sums of CUDA kernel durations per step, without launch gaps. The
layers are grouped by kind (op_kinds.kolo_layer_kind, from the zoo's layer names) and the kinds
mapped onto the kernel kinds of the PyTorch profile. Prints a markdown table, kind | kolo
ms/step | PyTorch ms/step | difference (and kolo's issue time, where recorded), with totals, then
the layers whose names match a torchvision module and differ the most.
"""

import argparse
import json
import sys

from op_kinds import KINDS, KOLO_KIND_SPLIT, TORCH_TYPES, kolo_layer_kind

# Comparison rows: (key, label, the PyTorch kinds summed into it). kolo's convolution backward is
# one time per layer, so it is compared with PyTorch's data, filter and other kernels together.
ROWS = [
    ("conv_fwd", "convolution forward", ["conv_fwd"]),
    (
        "conv_bwd",
        "convolution backward (data + filter)",
        ["conv_bwd_data", "conv_bwd_filter", "conv_bwd_other"],
    ),
    ("bn_fwd", KINDS["bn_fwd"], ["bn_fwd"]),
    ("bn_bwd", KINDS["bn_bwd"], ["bn_bwd"]),
    ("gemm", KINDS["gemm"], ["gemm"]),
    ("pool", KINDS["pool"], ["pool"]),
    ("elementwise", KINDS["elementwise"], ["elementwise"]),
    ("concat", KINDS["concat"], ["concat"]),
    ("loss", KINDS["loss"], ["loss"]),
    ("optimizer", KINDS["optimizer"], ["optimizer"]),
    ("copy", KINDS["copy"], ["copy"]),
    ("other", KINDS["other"], ["other"]),
]


def kolo_kind_times(profile: dict) -> tuple[dict, list]:
    """kolo's milliseconds per step per ROWS key (every key present), and the names of layers
    whose kind could not be told from their name (counted under "other")."""
    out = {key: 0.0 for key, _, _ in ROWS}
    issue = {key: 0.0 for key, _, _ in ROWS}
    unknown = []
    for layer in profile["layers"]:
        kind = layer.get("kind") or kolo_layer_kind(layer["name"])
        if kind not in KOLO_KIND_SPLIT:
            kind = "unknown"
        if kind == "unknown":
            unknown.append(layer["name"])
        fwd, bwd = KOLO_KIND_SPLIT[kind]
        out[fwd] += layer["forward_ms"]
        out[bwd] += layer["backward_ms"]
        issue[fwd] += layer.get("forward_issue_ms", 0.0)
        issue[bwd] += layer.get("backward_issue_ms", 0.0)
    out["optimizer"] += profile.get("update_ms", 0.0)
    profile_issue = issue if "forward_issue_ms" in profile["layers"][0] else None
    return out, unknown, profile_issue


def torch_kind_times(profile: dict) -> dict:
    """PyTorch's milliseconds per step per ROWS key (every key present)."""
    kinds = profile["kinds_ms"]
    return {key: sum(kinds.get(k, 0.0) for k in parts) for key, _, parts in ROWS}


def compare(kolo: dict, torch: dict, top_layers: int = 15) -> dict:
    """The comparison of a kolo replay profile and a PyTorch profile (both parsed JSON):
    {"rows": [{"kind", "label", "kolo_ms", "torch_ms", "diff_ms"}], "total": {...},
    "torch_conv_bwd": PyTorch's convolution backward split, "unknown_layers",
    "layers": the TOP_LAYERS layers with the largest kolo - PyTorch (fwd + bwd) among those whose
    name is a PyTorch module's of a type that does what the layer does (op_kinds.TORCH_TYPES)}."""
    k, unknown, issue = kolo_kind_times(kolo)
    t = torch_kind_times(torch)
    rows = [
        {"kind": key, "label": label, "kolo_ms": k[key], "torch_ms": t[key], "diff_ms": k[key] - t[key]}
        for key, label, _ in ROWS
    ]
    if issue is not None:
        for row in rows:
            row["kolo_issue_ms"] = issue[row["kind"]]
    kt, tt = sum(k.values()), sum(t.values())
    kinds = torch["kinds_ms"]
    modules = {m["name"]: m for m in torch.get("modules", [])}
    layers = []
    for layer in kolo["layers"]:
        kind = layer.get("kind") or kolo_layer_kind(layer["name"])
        m = modules.get(layer["name"])
        if m is None or m.get("type") not in TORCH_TYPES.get(kind, ()):
            continue
        kolo_ms = layer["forward_ms"] + layer["backward_ms"]
        torch_ms = m["forward_ms"] + m["backward_ms"]
        layers.append(
            {
                "name": layer["name"],
                "kind": kind,
                "kolo_fwd_ms": layer["forward_ms"],
                "kolo_bwd_ms": layer["backward_ms"],
                "torch_fwd_ms": m["forward_ms"],
                "torch_bwd_ms": m["backward_ms"],
                "diff_ms": kolo_ms - torch_ms,
            }
        )
    layers.sort(key=lambda row: -row["diff_ms"])
    return {
        "model": kolo.get("model"),
        "batch_size": kolo.get("batch_size"),
        "kolo_precision": kolo.get("precision"),
        "torch_precision": torch.get("precision"),
        "rows": rows,
        "total": {"kolo_ms": kt, "torch_ms": tt, "diff_ms": kt - tt},
        "kolo_timing": kolo.get("timing", "synchronised"),
        "kolo_step_ms": kolo.get("step_ms"),
        "kolo_issue_ms": sum(issue.values()) if issue is not None else None,
        "torch_step_time_ms": torch.get("step_time_ms_median"),
        "torch_conv_bwd": {
            p: kinds.get(p, 0.0) for p in ("conv_bwd_data", "conv_bwd_filter", "conv_bwd_other")
        },
        "unknown_layers": unknown,
        "layers": layers[:top_layers],
    }


def to_markdown(result: dict) -> str:
    marks = result.get("kolo_timing") == "marks"
    how = (
        "device time between events after consecutive layers (idle gaps included), and the host's "
        "time issuing them"
        if marks
        else "per-layer host wall time with a device synchronise after each layer (includes launch overhead)"
    )
    issued = result.get("kolo_issue_ms") is not None
    lines = [
        (
            f"{result['model']}, batch {result['batch_size']}, kolo {result['kolo_precision']}, "
            f"PyTorch {result['torch_precision']}. kolo: {how}; PyTorch: sum of CUDA kernel "
            "times per step (no launch gaps)."
        ),
        "",
        "| kind | kolo ms/step | PyTorch ms/step | kolo − PyTorch |"
        + (" kolo issue ms/step |" if issued else ""),
        "|------|-------------:|----------------:|---------------:|"
        + ("-------------------:|" if issued else ""),
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['label']} | {row['kolo_ms']:.3f} | {row['torch_ms']:.3f} | {row['diff_ms']:+.3f} |"
            + (f" {row['kolo_issue_ms']:.3f} |" if issued else "")
        )
    tot = result["total"]
    lines.append(
        f"| **total** | {tot['kolo_ms']:.3f} | {tot['torch_ms']:.3f} | {tot['diff_ms']:+.3f} |"
        + (f" {result['kolo_issue_ms']:.3f} |" if issued else "")
    )
    if result.get("kolo_step_ms"):
        lines.append("")
        lines.append(f"kolo timed step (wall, median, while profiling): {result['kolo_step_ms']:.3f} ms.")
    split = result["torch_conv_bwd"]
    lines.append("")
    lines.append(
        f"PyTorch convolution backward: data {split['conv_bwd_data']:.3f} ms, filter "
        f"{split['conv_bwd_filter']:.3f} ms, other {split['conv_bwd_other']:.3f} ms."
    )
    if result["torch_step_time_ms"] is not None:
        lines.append(f"PyTorch timed step (wall, median): {result['torch_step_time_ms']:.3f} ms.")
    if result["unknown_layers"]:
        names = ", ".join(result["unknown_layers"][:10])
        lines.append(f"kolo layers of unknown kind (counted as other): {names}")
    if result["layers"]:
        lines += [
            "",
            "Layers matched by name, largest kolo − PyTorch first (ms/step, forward + backward):",
            "",
            "| layer | kind | kolo fwd | kolo bwd | PyTorch fwd | PyTorch bwd | kolo − PyTorch |",
            "|-------|------|---------:|---------:|------------:|------------:|---------------:|",
        ]
        for r in result["layers"]:
            lines.append(
                f"| {r['name']} | {r['kind']} | {r['kolo_fwd_ms']:.3f} | {r['kolo_bwd_ms']:.3f} | "
                f"{r['torch_fwd_ms']:.3f} | {r['torch_bwd_ms']:.3f} | {r['diff_ms']:+.3f} |"
            )
    return "\n".join(lines) + "\n"


def load(path: str, fmt: str) -> dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("format") != fmt:
        raise ValueError(f"{path}: format is {data.get('format')!r}, expected {fmt!r}")
    return data


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kolo_profile", help="kolo-train --record-profile file")
    p.add_argument("torch_profile", help="torch_bench.py --profile file")
    p.add_argument("--json", metavar="FILE", help="also write the comparison to FILE")
    p.add_argument("--top-layers", type=int, default=15, help="layers to list (default 15)")
    args = p.parse_args(argv)
    try:
        kolo = load(args.kolo_profile, "kolo-replay-profile")
        torch = load(args.torch_profile, "kolo-torch-profile")
    except (OSError, ValueError) as e:
        print(f"compare_profiles: {e}", file=sys.stderr)
        return 2
    for field in ("model", "batch_size"):
        if kolo.get(field) != torch.get(field):
            print(
                f"compare_profiles: warning: {field} differs: kolo {kolo.get(field)!r}, "
                f"PyTorch {torch.get(field)!r}",
                file=sys.stderr,
            )
    result = compare(kolo, torch, args.top_layers)
    sys.stdout.write(to_markdown(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
