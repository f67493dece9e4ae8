"""Figures from aggregated sweep points (reports.efficiency.Point). Each function returns a
matplotlib Figure, or None when the data does not hold what the figure compares."""

from __future__ import annotations

import math
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only; no display needed or wanted
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from reports.efficiency import Point, label, varying  # noqa: E402

REPLAY_NOTE = "compute = replay: recorded per-layer timings played back, not measured GPU throughput"
RANKS_LABEL = "GPUs (training ranks)"
KNOBS = {
    "fusion_threshold_mb": ("Tensor Fusion threshold (MiB)", "fusion"),
    "cycle_time_ms": ("cycle time (ms)", "cycle-time"),
    "backward_passes_per_step": ("backward passes per step", "aggregation"),
}
_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _models(points: list[Point]) -> list[str]:
    return list(dict.fromkeys(p.config.get("model", "") for p in points))


def _grid(n: int, title: str, points: list[Point], height: float = 3.4) -> tuple[Figure, list]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(5.2 * cols, height * rows + 2.0), squeeze=False, layout="constrained"
    )
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    if any(p.replay for p in points):
        note = textwrap.fill("REPLAY: " + REPLAY_NOTE, width=int(fig.get_figwidth() * 11))
        fig.supxlabel(note, fontsize=9, color="#b00020", fontweight="bold")
    return fig, flat[:n]


def _legend(ax) -> None:
    """The legend under the axes, so that it never hides a line."""
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False)


def _finish(fig: Figure) -> Figure:
    return fig


def _variants(points: list[Point], exclude: tuple[str, ...]) -> tuple[list[str], dict[tuple, list[Point]]]:
    cols = varying(points, exclude=exclude)
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(tuple(p.config.get(c, "") for c in cols), []).append(p)
    return cols, groups


def _rank_axis(ax, ranks: list[int]) -> None:
    ranks = sorted(set(ranks))
    if len(ranks) > 1 and ranks[-1] / max(ranks[0], 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ranks)
    ax.set_xticklabels([str(r) for r in ranks])
    ax.minorticks_off()


def scaling(points: list[Point]) -> Figure | None:
    """Total images/sec against GPUs per model, one line per configuration, each with its ideal
    (linear) line from the configuration's smallest rank count."""
    ok = [p for p in points if p.total is not None]
    if len({p.ranks for p in ok}) < 2:
        return None
    models = _models(ok)
    fig, axes = _grid(len(models), "Throughput against GPUs (dashed: ideal scaling)", ok)
    for ax, model in zip(axes, models, strict=True):
        mine = [p for p in ok if p.config.get("model") == model]
        cols, groups = _variants(mine, exclude=("model",))
        bases = {}
        for members in groups.values():
            members.sort(key=lambda p: p.ranks)
            bases[id(members)] = round(members[0].total / members[0].ranks, 6)
        shared_ideal = len(set(bases.values())) == 1
        for i, (_, members) in enumerate(groups.items()):
            color = _COLORS[i % len(_COLORS)]
            xs = [p.ranks for p in members]
            ys = [p.total for p in members]
            errs = [p.total_spread or 0 for p in members]
            ax.errorbar(
                xs, ys, yerr=errs, marker="o", color=color, capsize=3, label=label(members[0].config, cols)
            )
            if not shared_ideal:
                ax.plot(xs, [bases[id(members)] * x for x in xs], linestyle="--", color=color, alpha=0.6)
        if shared_ideal:
            xs = sorted({p.ranks for p in mine})
            rate = next(iter(bases.values()))
            ax.plot(
                xs,
                [rate * x for x in xs],
                linestyle="--",
                color="black",
                alpha=0.7,
                label="ideal (linear scaling)",
            )
        ax.set_title(model)
        ax.set_xlabel(RANKS_LABEL)
        ax.set_ylabel("images/sec (all ranks)")
        _rank_axis(ax, [p.ranks for p in mine])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    return _finish(fig)


def efficiency_bars(points: list[Point]) -> Figure | None:
    """Scaling efficiency per model and rank count, one bar per configuration."""
    # At its base rank count a configuration is 100% by definition: only the larger counts.
    ok = [
        p for p in points if p.efficiency is not None and p.base_ranks is not None and p.ranks > p.base_ranks
    ]
    if not ok:
        return None
    models = _models(ok)
    fig, axes = _grid(
        len(models), "Scaling efficiency (100% = linear scaling from the smallest rank count)", ok
    )
    for ax, model in zip(axes, models, strict=True):
        mine = [p for p in ok if p.config.get("model") == model]
        _bars(ax, mine, lambda p: 100 * p.efficiency, "%.0f")
        ax.axhline(100, color="black", linewidth=0.8, linestyle=":")
        ax.set_title(model)
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_ylim(0, max(110, max(100 * p.efficiency for p in mine) * 1.1))
    return _finish(fig)


def _bars(ax, points: list[Point], value, fmt: str) -> None:
    cols, groups = _variants(points, exclude=("model",))
    ranks = sorted({p.ranks for p in points})
    n = max(len(groups), 1)
    width = 0.8 / n
    for i, (_, members) in enumerate(groups.items()):
        by_ranks = {p.ranks: p for p in members}
        slots = [(j + (i - (n - 1) / 2) * width, by_ranks[r]) for j, r in enumerate(ranks) if r in by_ranks]
        done = [(x, p) for x, p in slots if p.total is not None]
        bars = ax.bar(
            [x for x, _ in done],
            [value(p) for _, p in done],
            width=width * 0.95,
            color=_COLORS[i % len(_COLORS)],
            label=label(members[0].config, cols),
        )
        if n <= 4:
            ax.bar_label(bars, fmt=fmt, fontsize=7, padding=1)
        for x, p in slots:
            if p.total is None:  # every run of this point failed: say so where its bar would be
                ax.text(x, 0, " failed", rotation=90, ha="center", va="bottom", fontsize=7, color="#b00020")
    ax.set_xticks(range(len(ranks)))
    ax.set_xticklabels([str(r) for r in ranks])
    ax.set_xlim(-0.5, len(ranks) - 0.5)
    ax.set_xlabel(RANKS_LABEL)
    ax.grid(True, axis="y", alpha=0.3)
    _legend(ax)


def comparison(
    points: list[Point], column: str, values: tuple[str, ...], title: str, also_ignore: tuple[str, ...] = ()
) -> Figure | None:
    """Images/sec per model and rank count for each of `values` of `column` (for example ring
    against ps), when the data holds at least two of them in otherwise equal configurations
    (`also_ignore` aside)."""
    ok = paired([p for p in points if p.config.get(column) in values], column, also_ignore)
    if not any(p.total is not None for p in ok):
        return None
    models = _models(ok)
    fig, axes = _grid(len(models), title, ok)
    for ax, model in zip(axes, models, strict=True):
        mine = [p for p in ok if p.config.get("model") == model]
        _bars(ax, mine, lambda p: p.total, "%.0f")
        ax.set_title(model)
        ax.set_ylabel("images/sec (all ranks)")
    return _finish(fig)


def paired(points: list[Point], column: str, also_ignore: tuple[str, ...] = ()) -> list[Point]:
    """The points whose configuration, `column` and `also_ignore` aside, was also run with another
    value of `column` (for backend, the parameter server's own settings are set aside too)."""
    ignore = {column, *also_ignore} | ({"ps_servers", "ps_placement"} if column == "backend" else set())
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        key = tuple(v for k, v in sorted(p.config.items()) if k not in ignore)
        groups.setdefault(key, []).append(p)
    keep = {id(p) for g in groups.values() if len({p.config.get(column) for p in g}) >= 2 for p in g}
    return [p for p in points if id(p) in keep]


def knob_curve(points: list[Point], column: str) -> Figure | None:
    """Images/sec against one engine knob (fusion threshold, cycle time, backward passes per
    step) per model, one line per rank count and other configuration; only lines that cover at
    least two values of the knob are drawn."""
    ok = [p for p in points if p.total is not None and p.config.get(column, "") != ""]
    curves: dict[str, dict[tuple, list[Point]]] = {}
    for model in _models(ok):
        mine = [p for p in ok if p.config.get("model") == model]
        cols = varying(mine, exclude=("model", column))
        groups: dict[tuple, list[Point]] = {}
        for p in mine:
            groups.setdefault((p.ranks, *(p.config.get(c, "") for c in cols)), []).append(p)
        lines = {k: v for k, v in groups.items() if len({p.config[column] for p in v}) >= 2}
        if lines:
            curves[model] = lines
    if not curves:
        return None
    axis_label, _ = KNOBS[column]
    shown = [p for lines in curves.values() for members in lines.values() for p in members]
    fig, axes = _grid(len(curves), f"Throughput against {axis_label}", shown)
    for ax, (model, lines) in zip(axes, curves.items(), strict=True):
        cols = varying([p for m in lines.values() for p in m], exclude=("model", column))
        for i, (key, members) in enumerate(lines.items()):
            members.sort(key=lambda p: float(p.config[column]))
            xs = [float(p.config[column]) for p in members]
            name = f"{key[0]} ranks" + (" " + label(members[0].config, cols) if cols else "")
            ax.errorbar(
                xs,
                [p.total for p in members],
                yerr=[p.total_spread or 0 for p in members],
                marker="o",
                capsize=3,
                color=_COLORS[i % len(_COLORS)],
                label=name,
            )
        xs = sorted({float(p.config[column]) for m in lines.values() for p in m})
        if column == "fusion_threshold_mb" and xs[0] == 0 and len(xs) > 2:
            ax.set_xscale("symlog", linthresh=1)
        elif xs[0] > 0 and xs[-1] / xs[0] >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs], fontsize=8)
        ax.minorticks_off()
        ax.set_title(model)
        ax.set_xlabel(axis_label)
        ax.set_ylabel("images/sec (all ranks)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    return _finish(fig)


def all_figures(points: list[Point]) -> list[tuple[str, str, Figure]]:
    """(file stem, caption, figure) for every figure the data supports, in report order."""
    out = []
    candidates = [
        (
            "scaling",
            "Images/sec against GPUs, with the ideal-scaling line per configuration",
            scaling(points),
        ),
        ("efficiency", "Scaling efficiency against the smallest rank count", efficiency_bars(points)),
        (
            "ring-vs-ps",
            "Ring-allreduce against the parameter server",
            comparison(points, "backend", ("ring", "ps"), "Ring-allreduce against parameter server"),
        ),
        (
            "backends",
            "Every collective backend side by side",
            # MPI and NCCL have no kolo transport: compare them with the ring over any transport.
            comparison(points, "backend", ("ring", "mpi", "nccl"), "Collective backends", ("transport",)),
        ),
        (
            "tcp-vs-rdma",
            "TCP against RDMA",
            comparison(points, "transport", ("tcp", "rdma"), "TCP against RDMA (ibverbs)"),
        ),
    ]
    for column, (axis_label, stem) in KNOBS.items():
        candidates.append((stem, f"Images/sec against the {axis_label}", knob_curve(points, column)))
    for stem, caption, fig in candidates:
        if fig is not None:
            out.append((stem, caption, fig))
    return out


def save(fig: Figure, stem_path: str) -> list[str]:
    """Writes `fig` as stem_path.png and stem_path.svg; returns both paths."""
    paths = [stem_path + ".png", stem_path + ".svg"]
    fig.savefig(paths[0], dpi=110)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths
