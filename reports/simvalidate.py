"""Predicted against measured images/sec per configuration (the median of its measured repeats, and
the spread over them), then the median and worst absolute error.

Exit status (scripts/sim-validate): 0 compared; 1 no predicted row has a measured twin; 2 a bad
command line, or a CSV that is missing, malformed or cannot be read (reports.files).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import textwrap

from reports import schema

KEY = (
    "model",
    "ranks",
    "backend",
    "transport",
    "ps_servers",
    "ps_placement",
    "ps_pacing",
    "compression",
    "tcp_streams",
    "fusion_threshold_mb",
    "allreduce",
)
# What tells configurations apart within one model's panel of the figure: KEY less model and ranks.
CONFIG = tuple(k for k in KEY if k not in ("model", "ranks"))


# What a column left empty means (a file written before it): the setting's default.
_DEFAULTS = {"tcp_streams": "auto", "compression": "none", "allreduce": "flat"}


def _key(row: dict) -> tuple:
    return tuple(row.get(k, "") or _DEFAULTS.get(k, "") for k in KEY)


def compare(predicted: list[dict], measured: list[dict]) -> list[dict]:
    """One entry per predicted configuration (KEY settings) that has measured ok rows.

    A configuration measured more than once (a sweep's repeats) is compared with the median of its
    repeats, and its spread, (max - min) / median over them, says how far the measurement itself
    moved between runs: an error inside it cannot be told from the measurement's own noise.
    """
    meas: dict[tuple, list[float]] = {}
    compute: dict[tuple, str] = {}
    for r in schema.latest_per_point(measured):
        if r["status"] == "ok":
            meas.setdefault(_key(r), []).append(float(r["total_images_per_sec"]))
            compute.setdefault(_key(r), r.get("compute", ""))
    preds: dict[tuple, dict] = {}
    for p in schema.latest_per_point(predicted):
        if p["status"] == "ok" and _key(p) in meas:
            preds.setdefault(_key(p), p)
    out = []
    for key, p in preds.items():
        values = meas[key]
        mv = statistics.median(values)
        pv = float(p["total_images_per_sec"])
        out.append(
            {
                **{k: p[k] for k in KEY},
                "predicted": pv,
                "measured": mv,
                "measured_min": min(values),
                "measured_max": max(values),
                "repeats": len(values),
                "measured_compute": compute[key],
                "spread": (max(values) - min(values)) / mv,
                "error": (pv - mv) / mv,
            }
        )
    return out


def summary(pairs: list[dict]) -> list[str]:
    """The lines under the table: the median and worst absolute error against the goal and, where
    points were repeated, the measured spread and how many predictions fall inside it."""
    lines = []
    errs = [abs(x["error"]) for x in pairs]
    lines.append(
        f"{len(pairs)} points: median absolute error {100 * statistics.median(errs):.1f}%, "
        f"worst {100 * max(errs):.1f}% (goal: median <= 5%, worst <= 12%)"
    )
    repeated = [x for x in pairs if x["repeats"] > 1]
    if repeated:
        inside = sum(1 for x in repeated if abs(x["error"]) <= x["spread"])
        spreads = [x["spread"] for x in repeated]
        lines.append(
            f"measured spread over repeats (max - min over the median): median "
            f"{100 * statistics.median(spreads):.1f}%, worst {100 * max(spreads):.1f}%; "
            f"{inside} of {len(repeated)} repeated points predicted within their spread"
        )
    return lines


def table(pairs: list[dict]) -> str:
    # The parameter server's push pacing and compression, where some point sets them.
    paced = any(x.get("ps_pacing") for x in pairs)
    compressed = any(x.get("compression") not in ("", None, "none") for x in pairs)
    streams = any(x.get("tcp_streams") not in ("", None, "1", "auto") for x in pairs)
    extra = (
        ("ps pacing | " if paced else "")
        + ("compression | " if compressed else "")
        + ("tcp streams | " if streams else "")
    )
    lines = [
        "| model | GPUs | backend | " + extra + "fusion MiB | measured img/s | repeats | spread "
        "| predicted img/s | error |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * extra.count("|"),
    ]
    for x in pairs:
        spread = f"{100 * x['spread']:.1f}%" if x["repeats"] > 1 else "-"
        pacing = f"{x.get('ps_pacing') or ('off' if x['backend'] == 'ps' else '-')} | " if paced else ""
        compression = f"{x.get('compression') or '-'} | " if compressed else ""
        compression += f"{x.get('tcp_streams') or '-'} | " if streams else ""
        lines.append(
            f"| {x['model']} | {x['ranks']} | {x['backend']} | {pacing}{compression}"
            f"{x['fusion_threshold_mb'] or '-'} "
            f"| {x['measured']:.1f} | {x['repeats']} | {spread} | {x['predicted']:.1f} "
            f"| {100 * x['error']:+.1f}% |"
        )
    lines.append("")
    lines += summary(pairs)
    return "\n".join(lines) + "\n"


def _config_label(pair: dict, columns: list[str]) -> str:
    parts = []
    for c in columns:
        value = pair.get(c, "")
        if c == "fusion_threshold_mb":
            parts.append(f"fusion {value} MiB" if value else "")
        elif c in ("backend", "transport"):
            parts.append(value)
        elif value:
            parts.append(f"{c.removeprefix('ps_')} {value}")
    return " ".join(p for p in parts if p) or pair.get("backend", "")


def figure(pairs: list[dict], title: str = "kolo-sim: predicted beside measured"):
    """Images/sec against GPUs, one panel per model: each configuration in one colour, measured
    solid (the median of its repeats, the bar their range), predicted dashed with hollow markers,
    so that a prediction sits on the same axes as what it predicts. None without pairs."""
    if not pairs:
        return None
    from reports import plots  # matplotlib, only where a figure is wanted

    models = list(dict.fromkeys(p["model"] for p in pairs))
    distributed = [p for p in pairs if p["backend"] != "none"]
    columns = [c for c in CONFIG if len({p.get(c, "") for p in distributed}) > 1] or ["backend"]
    cols = min(len(models), 3)
    rows = -(-len(models) // cols)
    fig, axes = plots.plt.subplots(
        rows, cols, figsize=(5.2 * cols, 3.4 * rows + 2.2), squeeze=False, layout="constrained"
    )
    flat = list(axes.flat)
    for ax in flat[len(models) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    note = (
        "solid: measured (median of repeats, bar: their range); dashed, hollow: predicted. "
        + summary(pairs)[0]
    )
    if any(p.get("measured_compute") == "replay" for p in pairs):
        note += "\nmeasured with " + plots.REPLAY_NOTE
    # Wrapped to the figure's width (about 70 characters of 9-point text per 5.2-inch column), so
    # that no line runs past the figure's edges.
    width = 70 * cols
    note = "\n".join(textwrap.fill(line, width) for line in note.split("\n"))
    fig.supxlabel(note, fontsize=9)
    for ax, model in zip(flat, models, strict=False):
        handles = []
        for base in (p for p in pairs if p["model"] == model and p["backend"] == "none"):
            # The single rank without distribution: where every configuration starts.
            handles.append(
                ax.errorbar(
                    [1],
                    [base["measured"]],
                    color="black",
                    marker="*",
                    markersize=9,
                    yerr=[
                        [base["measured"] - base["measured_min"]],
                        [base["measured_max"] - base["measured"]],
                    ],
                    linestyle="none",
                    label="1 rank, no distribution: measured",
                )
            )
            handles += ax.plot(
                [1],
                [base["predicted"]],
                color="black",
                marker="*",
                markersize=11,
                markerfacecolor="none",
                linestyle="none",
                label="1 rank: predicted",
            )
        mine = [p for p in pairs if p["model"] == model and p["backend"] != "none"]
        configs = list(dict.fromkeys(tuple(p.get(c, "") for c in CONFIG) for p in mine))
        for i, config in enumerate(configs):
            line = sorted(
                (p for p in mine if tuple(p.get(c, "") for c in CONFIG) == config),
                key=lambda p: int(p["ranks"]),
            )
            ranks = [int(p["ranks"]) for p in line]
            measured = [p["measured"] for p in line]
            low = [p["measured"] - p["measured_min"] for p in line]
            high = [p["measured_max"] - p["measured"] for p in line]
            color = plots._COLORS[i % len(plots._COLORS)]
            name = _config_label(line[0], columns)
            handles.append(
                ax.errorbar(
                    ranks,
                    measured,
                    yerr=[low, high],
                    color=color,
                    marker="o",
                    capsize=3,
                    label=f"{name} measured",
                )
            )
            handles += ax.plot(
                ranks,
                [p["predicted"] for p in line],
                color=color,
                linestyle="--",
                marker="o",
                markerfacecolor="none",
                label=f"{name} predicted",
            )
        all_ranks = sorted({int(p["ranks"]) for p in pairs if p["model"] == model})
        ax.set_xticks(all_ranks)
        ax.set_xticklabels([str(r) for r in all_ranks])
        ax.set_title(plots.model_name(model))
        ax.set_xlabel(plots.RANKS_LABEL)
        ax.set_ylabel("images/sec (all ranks)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(
            handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False
        )
    return plots._finish(fig)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/sim-validate")
    ap.add_argument("predicted")
    ap.add_argument("measured")
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--plot", help="also draw predicted beside measured images/sec here (.png or .svg)")
    a = ap.parse_args(argv)
    try:
        for path in (a.predicted, a.measured):
            if not os.path.exists(path):
                raise schema.SchemaError(f"{path} does not exist")
        pairs = compare(
            schema.read_rows(a.predicted, "predicted CSV"), schema.read_rows(a.measured, "measured CSV")
        )
    except schema.SchemaError as e:
        print(f"sim-validate: {e}", file=sys.stderr)
        return 2
    if not pairs:
        print(
            "sim-validate: no predicted row has a measured twin (same model, ranks, backend, transport)",
            file=sys.stderr,
        )
        return 1
    text = table(pairs)
    print(text, end="")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    if a.plot:
        fig = figure(pairs)
        fig.savefig(a.plot, dpi=110)
        print(f"sim-validate: figure {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
