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
"""
import argparse
import contextlib
import json
import statistics
import sys
import time

import torch
import torchvision

MODELS = {
    "resnet101": (torchvision.models.resnet101, {}, 224),
    "resnet50": (torchvision.models.resnet50, {}, 224),
    "inception3": (torchvision.models.inception_v3, {"aux_logits": True, "init_weights": False}, 299),
    "vgg16": (torchvision.models.vgg16, {}, 224),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16"], default="tf32")
    p.add_argument("--num-warmup-batches", type=int, default=10)
    p.add_argument("--num-batches", type=int, default=30)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--json", help="also write the record to this file")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.num_batches < 1 or args.num_warmup_batches < 0:
        p.error("--batch-size and --num-batches must be >= 1, --num-warmup-batches >= 0")
    return args


def make_grad_scaler():
    """torch.amp.GradScaler("cuda") where this torch has it (2.3+), else torch.cuda.amp's."""
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def main(argv):
    args = parse_args(argv)
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

    build, kwargs, size = MODELS[args.model]
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
