#!/usr/bin/env python3
"""PyTorch eager peer of kolo-train: images/sec of a torchvision model on synthetic data.

Same protocol as kolo-train on one GPU: a fixed random batch, SGD with momentum 0.9 and weight
decay 1e-4, warm-up steps untimed, then timed steps; each step is forward, loss, backward and the
optimizer step. Precision: fp32 (TF32 off everywhere) or tf32 (TF32 on for convolutions and
matrix products), float32 storage either way; or mixed precision as kolo's cudnn backend does it:
fp16 (torch.autocast with float16, and a GradScaler at its defaults: dynamic loss scaling that
skips steps whose gradients overflow) or bf16 (torch.autocast with bfloat16, no scaling). Under
autocast the parameters, gradients and optimizer state stay float32, tensors stay NCHW (as in
kolo), and ops autocast leaves in float32 may use TF32. cudnn.benchmark is on, as kolo searches
convolution algorithms too.

Prints one JSON object on stdout (and writes it to --json when given):
{"framework": "pytorch", "torch_version", "cudnn_version", "gpu_model", "model", "batch_size",
 "precision", "image_size", "num_batches", "images_per_sec", "step_time_ms_median",
 "images_per_sec_stddev", "final_loss", and with fp16 "loss_scale" (the GradScaler's last scale)}

With --profile FILE, after the timed steps (which it leaves as they are) it runs PROFILE_STEPS more
under torch.profiler and writes FILE: the CUDA kernel time per step by operation kind (op_kinds.py),
the top kernels, and the forward and backward kernel time per step of every torchvision module
(summarize_profile). These are sums of kernel durations, without launch gaps.
"""

import argparse
import collections
import contextlib
import json
import statistics
import sys
import time

from op_kinds import KINDS, kernel_kind

# torch and torchvision are imported in main(), so that the profile helpers below can be imported
# (and tested) where torch is not installed.

# model: (torchvision.models builder, its arguments, image size)
MODELS = {
    "resnet101": ("resnet101", {}, 224),
    "resnet50": ("resnet50", {}, 224),
    "inception3": ("inception_v3", {"aux_logits": True, "init_weights": False}, 299),
    "vgg16": ("vgg16", {}, 224),
}
PROFILE_STEPS = 3
TOP_KERNELS = 25
MODULE_RANGE = "module::"  # prefix of the record_function range around each module's forward


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16"], default="tf32")
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches", type=int, default=30)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--json", help="also write the record to this file")
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="after the timed steps, profile a few more "
        "and write the kernel time per operation kind and per module to FILE (JSON)",
    )
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.num_batches < 1 or args.num_warmup_batches < 0:
        p.error("--batch-size and --num-batches must be >= 1, --num-warmup-batches >= 0")
    return args


def make_grad_scaler():
    """torch.amp.GradScaler("cuda") where this torch has it (2.3+), else torch.cuda.amp's."""
    import torch

    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def summarize_profile(records, steps: int, module_types=None, top: int = TOP_KERNELS) -> dict:
    """Per-step kernel times from RECORDS, (kernel name, names of the ranges around its launch,
    module or None, "forward" | "backward" | None, duration in microseconds) for every kernel of
    STEPS steps: {"kinds_ms": {kind: ms} over every kind of KINDS, "total_kernel_ms",
    "top_kernels": the TOP longest [{"name", "kind", "calls", "ms"}] (calls and ms per step),
    "modules": [{"name", "type", "forward_ms", "backward_ms"}] in order of first appearance (type
    from MODULE_TYPES, name -> class name, when given), "outside_modules_ms": {"backward": backward
    kernels of no module (gradient accumulation, the loss), "other": the rest (the loss, the
    optimizer)}}."""
    kinds = dict.fromkeys(KINDS, 0.0)
    kernels = {}  # name -> [kind, calls, us]
    modules = {}  # name -> [forward us, backward us]
    outside = {"backward": 0.0, "other": 0.0}
    for name, ops, module, phase, us in records:
        kind = kernel_kind(name, ops)
        kinds[kind] += us
        entry = kernels.setdefault(name, [kind, 0, 0.0])
        entry[1] += 1
        entry[2] += us
        if module is None:
            outside["backward" if phase == "backward" else "other"] += us
        else:
            modules.setdefault(module, [0.0, 0.0])[0 if phase == "forward" else 1] += us
    per_step = 1e-3 / steps  # microseconds in STEPS steps -> milliseconds per step

    def ms(us):
        return round(us * per_step, 4)

    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][2])[:top]
    types = module_types or {}
    return {
        "kinds_ms": {k: ms(v) for k, v in kinds.items()},
        "total_kernel_ms": ms(sum(kinds.values())),
        "top_kernels": [
            {"name": n[:300], "kind": kind, "calls": calls / steps, "ms": ms(us)}
            for n, (kind, calls, us) in ranked
        ],
        "modules": [
            {"name": m, "type": types.get(m, ""), "forward_ms": ms(f), "backward_ms": ms(b)}
            for m, (f, b) in modules.items()
        ],
        "outside_modules_ms": {k: ms(v) for k, v in outside.items()},
    }


def attribute_kernel(chain, seq_module: dict):
    """(module, phase) of a kernel whose launching ranges are CHAIN, (name, sequence number) pairs
    innermost first: the innermost module range for a forward kernel; for a backward kernel, the
    module whose forward recorded the sequence number of the autograd node running it."""
    for name, seq in chain:
        if name.startswith(MODULE_RANGE):
            return name[len(MODULE_RANGE) :], "forward"
        if name.startswith("autograd::engine::evaluate_function"):
            return seq_module.get(seq), "backward"
    return None, None


def kernel_records(events) -> list:
    """The summarize_profile records of a torch.profiler run's events (prof.events())."""

    def chain(evt):
        out = []
        while evt is not None:
            out.append((evt.name, getattr(evt, "sequence_nr", -1)))
            evt = evt.cpu_parent
        return out

    # Forward ops that create autograd nodes carry the node's sequence number; the backward's
    # evaluate_function range carries it again, which ties backward kernels to their module.
    seq_module = {}
    for evt in events:
        seq = getattr(evt, "sequence_nr", -1)
        if seq >= 0 and seq not in seq_module and not evt.name.startswith("autograd::"):
            module, phase = attribute_kernel(chain(evt), {})
            if phase == "forward":
                seq_module[seq] = module
    records = []
    for evt in events:
        kernels = getattr(evt, "kernels", None)
        if not kernels:
            continue
        ranges = chain(evt)
        module, phase = attribute_kernel(ranges, seq_module)
        ops = tuple(name for name, _ in ranges)
        for k in kernels:
            if not k.name.startswith(MODULE_RANGE):
                records.append((k.name, ops, module, phase, k.duration))
    return records


def write_profile(path, step, model, record: dict, steps: int = PROFILE_STEPS):
    """Runs STEPS more steps under torch.profiler, with a range around every module's forward,
    and writes RECORD's identifying fields and summarize_profile's result to PATH as JSON."""
    import torch

    handles, open_ranges = [], collections.defaultdict(list)

    def enter(name):
        def hook(module, inputs):
            rf = torch.profiler.record_function(MODULE_RANGE + name)
            rf.__enter__()
            open_ranges[name].append(rf)

        return hook

    def leave(name):
        def hook(module, inputs, output):
            open_ranges[name].pop().__exit__(None, None, None)

        return hook

    types = {}
    for name, module in model.named_modules():
        if name:
            types[name] = type(module).__name__
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave(name)))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    try:
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(steps):
                with torch.profiler.record_function("kolo::step"):
                    step()
                torch.cuda.synchronize()
    finally:
        for h in handles:
            h.remove()
    keys = (
        "model",
        "batch_size",
        "precision",
        "image_size",
        "gpu_model",
        "torch_version",
        "cudnn_version",
        "step_time_ms_median",
    )
    out = {
        "format": "kolo-torch-profile",
        "version": 1,
        **{k: record[k] for k in keys},
        "profiled_steps": steps,
        **summarize_profile(kernel_records(prof.events()), steps, types),
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main(argv):
    args = parse_args(argv)
    import torch
    import torchvision

    if not torch.cuda.is_available():
        print("torch_bench: no CUDA device", file=sys.stderr)
        return 77
    tf32 = args.precision != "fp32"
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    if amp_dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        print("torch_bench: bf16 needs compute capability 8.0 or newer", file=sys.stderr)
        return 77
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", 0)

    builder, kwargs, size = MODELS[args.model]
    build = getattr(torchvision.models, builder)
    model = build(weights=None, num_classes=args.num_classes, **kwargs).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator(device=dev).manual_seed(1)
    images = torch.randn(args.batch_size, 3, size, size, device=dev, generator=gen)
    labels = torch.randint(0, args.num_classes, (args.batch_size,), device=dev, generator=gen)

    scaler = make_grad_scaler() if amp_dtype == torch.float16 else None

    def step():
        opt.zero_grad(set_to_none=True)
        autocast = None if amp_dtype is None else torch.autocast("cuda", dtype=amp_dtype)
        with autocast or contextlib.nullcontext():
            out = model(images)
            if isinstance(out, tuple):  # Inception V3 in training mode: (logits, aux_logits)
                loss = loss_fn(out[0], labels) + 0.4 * loss_fn(out[1], labels)
            else:
                loss = loss_fn(out, labels)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    for _ in range(args.num_warmup_batches):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.num_batches):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()  # per-step wall time, as kolo-train measures its steps
        times.append(time.perf_counter() - t0)
    rates = [args.batch_size / t for t in times]
    total = sum(times)
    record = {
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "cudnn_version": torch.backends.cudnn.version(),
        "gpu_model": torch.cuda.get_device_name(dev),
        "model": args.model,
        "batch_size": args.batch_size,
        "precision": args.precision,
        "image_size": size,
        "num_batches": args.num_batches,
        "images_per_sec": args.batch_size * args.num_batches / total,
        "step_time_ms_median": statistics.median(times) * 1e3,
        "images_per_sec_stddev": statistics.pstdev(rates),
        "final_loss": float(loss.item()),
    }
    if scaler is not None:
        record["loss_scale"] = float(scaler.get_scale())
    text = json.dumps(record)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.profile:
        write_profile(args.profile, step, model, record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
