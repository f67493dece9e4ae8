"""kolo-sim against published scaling efficiencies: each point of a points file (sim/published/*.json:
model, GPUs, backend, transport, the published efficiency and where it was published) predicted by
`kolo-sim predict` with the file's settings, and its error in points of efficiency.

Exit status (scripts/sim-published): 0 compared; 1 kolo-sim failed on a point; 2 a bad command
line or a points file that is missing or malformed (reports.files reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from reports import files

REQUIRED = ("model", "ranks", "backend", "transport", "efficiency", "source")
BACKENDS = ("nccl", "ring", "ps")
TRANSPORTS = ("tcp", "rdma")


def load_points(path: str) -> dict:
    """The points file, checked: every point names what it is and where it was published."""
    doc = json.loads(files.read_text(path, "points file", files.CONFIG_LIMIT))
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list) or not doc["points"]:
        raise ValueError(f"{path}: expected an object with a non-empty list 'points'")
    settings = doc.get("settings") or {}
    rates = settings.get("gpu_rate") or {}
    for i, p in enumerate(doc["points"]):
        missing = [k for k in REQUIRED if k not in p]
        if missing:
            raise ValueError(f"{path}: point {i + 1} lacks {', '.join(missing)}")
        if not (0 < float(p["efficiency"]) <= 1):
            raise ValueError(f"{path}: point {i + 1}: efficiency {p['efficiency']} is outside (0, 1]")
        if p["backend"] not in BACKENDS or p["transport"] not in TRANSPORTS:
            raise ValueError(
                f"{path}: point {i + 1}: backend {p['backend']!r} / transport {p['transport']!r}; "
                f"allowed: {', '.join(BACKENDS)} / {', '.join(TRANSPORTS)}"
            )
        if not str(p["source"]).strip():
            raise ValueError(f"{path}: point {i + 1} has an empty source")
        if p["model"] not in rates:
            raise ValueError(f"{path}: point {i + 1}: no settings.gpu_rate for {p['model']}")
    return doc


def sim_args(doc: dict, point: dict, json_path: str, step_jitter: float | None) -> list[str]:
    """kolo-sim predict's arguments for one point."""
    s = doc.get("settings") or {}
    model = point["model"]
    args = [
        "predict",
        "--model", model,
        "--ranks", str(point["ranks"]),
        "--ranks-per-host", str(s.get("ranks_per_host", 4)),
        "--backend", point["backend"],
        "--transport", point["transport"],
        "--link", str(s.get("link", "25gbit")),
        "--batch-size", str(s.get("batch_size", 64)),
        "--gpu-rate", str(s["gpu_rate"][model]),
        "--profile", f"models/profiles/{model}-h100-b64.json",
        "--calibration", str(s.get("calibration", "sim/calibrations/paper-25gbe.json")),
        "--framework", str(s.get("framework", "horovod-tf")),
        "--json", json_path,
    ]  # fmt: skip
    if point["backend"] == "ps":
        args += ["--ps-servers", str(point.get("ps_servers", 16)), "--ps-placement", "greedy",
                 "--ps-hosts", "spread"]  # fmt: skip
    if step_jitter is not None:
        args += ["--step-jitter", str(step_jitter)]
    return args


def predict(sim: str, doc: dict, step_jitter: float | None) -> list[dict]:
    """Every point with its predicted efficiency and the error, in points of efficiency."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(doc["points"]):
            path = os.path.join(tmp, f"{i}.json")
            run = subprocess.run([sim, *sim_args(doc, p, path, step_jitter)], capture_output=True,
                                 text=True, timeout=120)  # fmt: skip
            if run.returncode != 0:
                raise RuntimeError(f"kolo-sim failed on point {i + 1}: {run.stderr.strip()}")
            with open(path) as f:
                rec = json.load(f)
            rate = float(doc["settings"]["gpu_rate"][p["model"]])
            eff = float(rec["results"]["images_per_sec_per_rank"]) / rate
            out.append(dict(p, predicted=eff, error_points=100 * (eff - float(p["efficiency"]))))
    return out


def summary(rows: list[dict]) -> str:
    errs = [abs(r["error_points"]) for r in rows]
    within = sum(1 for e in errs if e <= 5)
    median = statistics.median(errs)
    return (
        f"{len(rows)} published points: median absolute error {median:.1f} points of "
        f"efficiency, worst {max(errs):.1f}; {within} of {len(rows)} within 5 points"
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| model | GPUs | backend | transport | published | predicted | error (points) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['ranks']} | {r['backend']} | {r['transport']} | "
            f"{float(r['efficiency']):.2f} | {r['predicted']:.2f} | {r['error_points']:+.1f} |"
        )
    return "\n".join(lines)


def figure(rows: list[dict], path: str) -> None:
    from reports import plots  # matplotlib (headless), only where a figure is wanted

    plt = plots.plt
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    ax.plot([0, 1.05], [0, 1.05], color="0.3", linewidth=1, label="predicted = published")
    ax.fill_between([0, 1.05], [-0.05, 1.0], [0.05, 1.1], color="0.85", label="within 5 points")
    marks = {("nccl", "tcp"): "o", ("nccl", "rdma"): "s", ("ps", "tcp"): "^", ("ring", "tcp"): "o"}
    for model in sorted({r["model"] for r in rows}):
        for (backend, transport), mark in marks.items():
            sel = [r for r in rows if r["model"] == model and r["backend"] == backend
                   and r["transport"] == transport]  # fmt: skip
            if sel:
                ax.scatter([float(r["efficiency"]) for r in sel], [r["predicted"] for r in sel],
                           marker=mark, s=46, label=f"{model} {backend} {transport}")  # fmt: skip
    ax.set_xlim(0.3, 1.02)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("published scaling efficiency")
    ax.set_ylabel("kolo-sim's prediction")
    ax.set_title("kolo-sim against Horovod's published efficiencies")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/sim-published", description=__doc__.split("\n\n")[0])
    ap.add_argument("points", nargs="?", default="sim/published/horovod.json")
    ap.add_argument("--sim", default="build/bin/kolo-sim", help="the kolo-sim binary")
    ap.add_argument("--step-jitter", type=float, default=None,
                    help="one GPU's step-time spread (default: the calibration's)")  # fmt: skip
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--plot", help="write the figure here (PNG)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        doc = load_points(a.points)
    except (ValueError, OSError) as e:
        print(f"sim-published: {e}", file=sys.stderr)
        return 2
    if not os.access(a.sim, os.X_OK):
        print(f"sim-published: {a.sim} is not an executable kolo-sim (build it first)", file=sys.stderr)
        return 2
    try:
        rows = predict(a.sim, doc, a.step_jitter)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"sim-published: {e}", file=sys.stderr)
        return 1
    text = table(rows) + "\n\n" + summary(rows) + "\n"
    print(text, end="")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    if a.plot:
        figure(rows, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
