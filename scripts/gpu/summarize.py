#!/usr/bin/env python3
"""The tables of scripts/gpu-check, from the records its steps wrote.

    summarize.py RECORDS_DIR RESULTS_JSON [--gpu NAME]

RECORDS_DIR holds one JSON record per step: kolo-train's run records (kolo-<model>-b<batch>-
<precision>.json, kolo-ps-<staging>-..., kolo-ring-np..., kolo-nccl-np...), torch_bench.py's
(torch-<model>-b<batch>-<precision>.json) and kolo-allreduce-bench's (bench-*.json). Prints
markdown tables on stdout — kolo against PyTorch per model and precision, the bench's device rows
by size, staged against overlapped parameter servers, the multi-process runs — naming the GPU
beside every timing, and writes every record to RESULTS_JSON. A record that cannot be read is
named, never fatal: the summary is rewritten after every step of a run that may be cut short.
"""

import argparse
import glob
import json
import os
import re
import sys


def load_records(folder):
    recs, bad = {}, []
    for f in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            with open(f, encoding="utf-8") as fh:
                recs[os.path.basename(f)[: -len(".json")]] = json.load(fh)
        except (OSError, ValueError) as e:
            bad.append(f"{os.path.basename(f)}: {e}")
    return recs, bad


def kolo_rate(rec):
    if not rec or rec.get("status") != "ok":
        return None
    return rec.get("results", {}).get("total_images_per_sec")


def train_table(recs, gpu):
    """kolo-<model>-b<batch>-<precision> against torch-<same>."""
    lines = [
        f"Training, one GPU ({gpu}), images/sec:",
        "",
        (
            "| model | batch | precision | kolo | PyTorch eager | kolo / PyTorch | kolo, conv plans "
            "| plans / PyTorch | final loss: kolo / plans |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = 0
    for name in sorted(recs):
        if (
            not name.startswith("kolo-")
            or "-np" in name
            or name.startswith(("kolo-ps-", "kolo-plans-"))
        ):
            continue
        key = name[len("kolo-") :]
        # <model>-b<batch>[-<precision>]: the precision may itself begin with "b" (bf16).
        m = re.fullmatch(r"(.+?)-b(\d+)(?:-(.+))?", key)
        if not m:
            continue
        model, batch, prec = m.group(1), m.group(2), m.group(3) or ""
        k = kolo_rate(recs[name])
        t = recs.get("torch-" + key, {}).get("images_per_sec")
        ks = f"{k:.1f}" if k else f"failed: {str(recs[name].get('error', ''))[:60]}"
        ts = f"{t:.1f}" if t else "n/a"
        ratio = f"{k / t:.2f}x" if k and t else "n/a"
        plans = recs.get("kolo-plans-" + key)
        kp = kolo_rate(plans) if plans else None
        ps = f"{kp:.1f}" if kp else ("n/a" if plans is None else "failed")
        pratio = f"{kp / t:.2f}x" if kp and t else "n/a"
        # The same synthetic batches and initial weights: the plans must train as the legacy
        # calls do, so a final loss far from kolo's says a convolution differs. (PyTorch starts
        # from weights of its own: its loss is not comparable.)
        losses = " / ".join(
            f"{v:.2f}" if isinstance(v, (int, float)) else "n/a"
            for v in (
                recs[name].get("results", {}).get("final_loss"),
                (plans or {}).get("results", {}).get("final_loss"),
            )
        )
        lines.append(
            f"| {model} | {batch} | {prec or 'tf32'} | {ks} | {ts} | {ratio} | {ps} | {pratio} "
            f"| {losses} |"
        )
        rows += 1
    return lines if rows else []


def bench_tables(recs, gpu):
    out = []
    for name in sorted(recs):
        if not name.startswith("bench-"):
            continue
        doc = recs[name]
        by_size = {}
        labels = []
        for r in doc.get("rows", []):
            by_size.setdefault(r["bytes"], {})[r["backend"]] = r
            if r["backend"] not in labels:
                labels.append(r["backend"])
        if not by_size:
            continue
        # One rank moves nothing between ranks: its bus bandwidth is 0 by definition (nccl-tests
        # prints 0 too), so the algorithm bandwidth is shown.
        bw = "busbw_gbs" if doc.get("ranks", 1) > 1 else "algbw_gbs"
        out += [
            "",
            (
                f"{name}: kolo-allreduce-bench, {doc.get('ranks', '?')} rank(s), device buffers, "
                f"{gpu}; {bw[:5]} GB/s (median time us), wrong elements marked:"
            ),
            "",
            "| bytes | " + " | ".join(labels) + " |",
            "| --- | " + " | ".join("---" for _ in labels) + " |",
        ]
        for size in sorted(by_size):
            cells = []
            for label in labels:
                r = by_size[size].get(label)
                if r is None:
                    cells.append("")
                    continue
                wrong = r.get("wrong")
                mark = f" WRONG {wrong}" if wrong else ""
                cells.append(f"{r[bw]:.2f} ({r['time']['median_us']:.0f}){mark}")
            out.append(f"| {size} | " + " | ".join(cells) + " |")
    return out


def ps_table(recs, gpu):
    rates = {}
    for name, rec in recs.items():
        if name.startswith("kolo-ps-"):
            staging = name[len("kolo-ps-") :].split("-")[0]
            rates[staging] = (kolo_rate(rec), rec)
    if not rates:
        return []
    lines = [
        "",
        f"Parameter servers with GPU gradients ({gpu}), 2 workers + 1 server sharing it:",
    ]
    for staging in ("sync", "overlap"):
        if staging in rates:
            r, rec = rates[staging]
            lines.append(
                f"- staging {staging}: "
                + (
                    f"{r:.1f} images/sec total"
                    if r
                    else f"failed: {str(rec.get('error', ''))[:80]}"
                )
            )
    s, o = rates.get("sync", (None,))[0], rates.get("overlap", (None,))[0]
    if s and o:
        lines.append(f"- overlap / sync: {o / s:.2f}x")
    return lines


def multi_lines(recs):
    lines = []
    for name, r in sorted(recs.items()):
        if "-np" in name and name.startswith("kolo-"):
            res = r.get("results", {})
            lines.append(
                f"- {name}: status {r.get('status')}, {res.get('total_images_per_sec', 0):.1f} "
                f"img/s total, {res.get('images_per_sec_per_rank', 0):.1f} per rank "
                f"{r.get('error', '')}"
            )
    return [""] + lines if lines else []


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records")
    p.add_argument("results_json")
    p.add_argument("--gpu", default="unknown GPU")
    args = p.parse_args(argv)
    recs, bad = load_records(args.records)
    lines = train_table(recs, args.gpu)
    lines += bench_tables(recs, args.gpu)
    lines += ps_table(recs, args.gpu)
    lines += multi_lines(recs)
    lines += [f"unreadable record {b}" for b in bad]
    print("\n".join(lines))
    with open(args.results_json, "w", encoding="utf-8") as f:
        json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
