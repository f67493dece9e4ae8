"""Figures from aggregated sweep points (reports.efficiency.Point). Each function returns a
matplotlib Figure, or None when the data does not hold what the figure compares.

Scaling efficiency here is always the field's definition (reports/efficiency.py): per-rank
images/sec over the images/sec of one rank without distributed communication (backend "none").
Those baseline points are not drawn as configurations of their own; they are the reference: the
ideal line (N times the baseline) in throughput plots and the 100% line in efficiency plots."""

from __future__ import annotations

import math
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only; no display needed or wanted
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from reports import schema, settings  # noqa: E402
from reports.efficiency import Point, label, varying  # noqa: E402

REPLAY_NOTE = "compute = replay: recorded per-layer timings played back, not measured GPU throughput"
RANKS_LABEL = "GPUs (training ranks)"
BASELINE_WORDS = "a single rank without distribution"
IDEAL_LABEL = "ideal (N × single rank without distribution)"
IDEAL_OWN_LABEL = "ideal from the configuration's smallest rank count (no single-rank baseline in the data)"
EFFICIENCY_TITLE = "Scaling efficiency: images/sec per GPU ÷ images/sec of " + BASELINE_WORDS
EFFICIENCY_AXIS = "scaling efficiency (%)\nper-GPU images/sec ÷ single rank without distribution"
OWN_EFFICIENCY_AXIS = "efficiency vs own smallest rank count (%)"
KNOBS = {
    "fusion_threshold_mb": ("Tensor Fusion threshold (MiB)", "fusion"),
    "cycle_time_ms": ("cycle time (ms)", "cycle-time"),
    "backward_passes_per_step": ("backward passes per step", "aggregation"),
}
MODEL_NAMES = {
    "inception3": "Inception V3",
    "inception3-noaux": "Inception V3 (no aux)",
    "resnet50": "ResNet-50",
    "resnet101": "ResNet-101",
    "resnet152": "ResNet-152",
    "vgg16": "VGG-16",
}
# The four consecutive phases of a step (schema.PHASES): legend name and colour.
PHASE_STYLE = {
    "forward_ms": ("forward", "#4c72b0"),
    "backward_ms": ("backward", "#55a868"),
    "exposed_comm_ms": ("exposed communication (waiting after backward)", "#c44e52"),
    "update_ms": ("update (optimizer; ps: copying pulled weights)", "#8172b2"),
}
OTHER_COLOR = "#c8c8c8"
HIDDEN_COLOR = "#8c1c24"
_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def model_name(model: str) -> str:
    """The network's name as papers write it (VGG-16, ResNet-101), else kolo's id."""
    return MODEL_NAMES.get(model, model)


def _models(points: list[Point]) -> list[str]:
    return list(dict.fromkeys(p.config.get("model", "") for p in points))


def network_note(points: list[Point]) -> str:
    """What network the points ran over, in words, when they all share one: loopback on one host,
    or an emulated one with its links and the links its time dilation stands for. Empty when the
    points differ (the legends then name it) or say nothing."""
    kinds = {tuple(p.config.get(c, "") for c in ("network", "link", "dilation")) for p in points}
    if len(kinds) != 1:
        return ""
    network, link, dilation = kinds.pop()
    if network == "emulated" and link:
        text = f"emulated network: {link} links"
        if dilation not in ("", "1"):
            represented = points[0].config.get("link_represented", "")
            text += f", time dilation {dilation} (stands for {represented} links)"
        return text
    if network == "loopback":
        return "network: loopback on one host (the ranks share its cores)"
    return ""


def _replay_note(fig: Figure, points: list[Point]) -> None:
    parts = []
    if any(p.replay for p in points):
        parts.append("REPLAY: " + REPLAY_NOTE)
    if parts and (net := network_note(points)):
        parts.append(net)
    if parts:
        note = textwrap.fill(". ".join(parts), width=int(fig.get_figwidth() * 11))
        fig.supxlabel(note, fontsize=9, color="#b00020", fontweight="bold")


def _grid(n: int, title: str, points: list[Point], height: float = 3.4) -> tuple[Figure, list]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(5.2 * cols, height * rows + 2.0), squeeze=False, layout="constrained"
    )
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle(textwrap.fill(title, width=int(5.2 * cols * 8)), fontsize=12, fontweight="bold")
    _replay_note(fig, points)
    return fig, flat[:n]


# The room under each row of panels that _grid leaves for a legend, inches (less what the legend's
# offset below the axes and their label take), and the characters of one legend line.
_LEGEND_ROOM_IN = 0.5
_LEGEND_LINE_CHARS = 80


def _legend(ax) -> None:
    """The legend under the axes, so that it never hides a line; labels wider than a panel are
    wrapped (a label naming many settings would otherwise squeeze the axes to nothing)."""
    legend = ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False)
    for text in legend.get_texts():
        text.set_text(textwrap.fill(text.get_text(), width=_LEGEND_LINE_CHARS))


def _finish(fig: Figure) -> Figure:
    """Grows the figure to hold its tallest legend: constrained layout would otherwise shrink
    the axes to nothing when a panel has many lines (a sweep of many configurations)."""
    legends = [ax.get_legend() for ax in fig.axes if ax.get_visible() and ax.get_legend()]
    if not legends:
        return fig
    renderer = fig.canvas.get_renderer()
    need = max(leg.get_window_extent(renderer).height for leg in legends) / fig.dpi
    if need > _LEGEND_ROOM_IN:
        rows = {ax.get_subplotspec().rowspan.start for ax in fig.axes if ax.get_subplotspec()}
        w, h = fig.get_size_inches()
        fig.set_size_inches(w, h + (need - _LEGEND_ROOM_IN) * len(rows))
    return fig


PS_ONLY = settings.PS_ONLY


def label_columns(points: list[Point], exclude: tuple[str, ...] = ("model",)) -> list[str]:
    """The columns that tell `points` apart in a legend: those that vary, less the parameter
    server's own settings unless they vary among its points (a lone ps variant is just "ps")."""
    ps = [p for p in points if p.config.get("backend") == "ps"]
    return [c for c in varying(points, exclude=exclude) if c not in PS_ONLY or c in varying(ps)]


def _variants(points: list[Point], exclude: tuple[str, ...]) -> tuple[list[str], dict[tuple, list[Point]]]:
    """The configurations among `points` (`exclude` aside) and the legend columns naming them."""
    cols = varying(points, exclude=exclude)
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(tuple(p.config.get(c, "") for c in cols), []).append(p)
    # One configuration: named by its backend rather than "all".
    return label_columns(points, exclude) or ["backend"], groups


def _rank_axis(ax, ranks: list[int]) -> None:
    ranks = sorted(set(ranks))
    if len(ranks) > 1 and ranks[-1] / max(ranks[0], 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ranks)
    ax.set_xticklabels([str(r) for r in ranks])
    ax.minorticks_off()


def _distributed(points: list[Point]) -> list[Point]:
    """The points that are not the single-rank baselines."""
    return [p for p in points if not p.is_baseline]


def _baselines(points: list[Point]) -> list[float]:
    """The distinct baseline images/sec (efficiency's denominators) among `points`."""
    return list(dict.fromkeys(round(p.baseline, 6) for p in points if p.baseline))


def scaling(points: list[Point]) -> Figure | None:
    """Total images/sec against GPUs per model, one line per configuration, with the ideal line
    N × the images/sec of a single rank without distribution (dashed). A configuration without
    that baseline in the data gets the ideal from its own smallest rank count instead, dashed in
    its colour and labelled so."""
    ok = [p for p in _distributed(points) if p.total is not None]
    if len({p.ranks for p in ok}) < 2:
        return None
    models = _models(ok)
    title = "Throughput against GPUs (dashed: ideal = N × " + BASELINE_WORDS + ")"
    if not _baselines(ok):
        title = "Throughput against GPUs (dashed: ideal from each configuration's smallest rank count)"
    fig, axes = _grid(len(models), title, ok)
    for ax, model in zip(axes, models, strict=True):
        mine = [p for p in ok if p.config.get("model") == model]
        cols, groups = _variants(mine, exclude=("model",))
        xs_all = sorted({p.ranks for p in mine} | {1})
        own_labelled = False
        for i, members in enumerate(groups.values()):
            members.sort(key=lambda p: p.ranks)
            color = _COLORS[i % len(_COLORS)]
            xs = [p.ranks for p in members]
            ax.errorbar(
                xs,
                [p.total for p in members],
                yerr=[p.total_spread or 0 for p in members],
                marker="o",
                color=color,
                capsize=3,
                label=label(members[0].config, cols),
            )
            if not _baselines(members):  # old data: no single-rank run without distribution
                base = members[0].total / members[0].ranks
                ax.plot(
                    xs,
                    [base * x for x in xs],
                    linestyle="--",
                    color=color,
                    alpha=0.6,
                    label=None if own_labelled else IDEAL_OWN_LABEL,
                )
                own_labelled = True
        baselines = _baselines(mine)
        for j, rate in enumerate(baselines):
            which = [p for p in mine if p.baseline and round(p.baseline, 6) == rate]
            name = IDEAL_LABEL + f": {rate:.4g} images/sec × N"
            if len(baselines) > 1:  # say which configurations share this one
                name += " for " + ", ".join(dict.fromkeys(label(p.config, cols) for p in which))
            shade = ("black", "#555555", "#999999")[j % 3]
            ax.plot(xs_all, [rate * x for x in xs_all], linestyle="--", color=shade, alpha=0.8, label=name)
            ax.plot([1], [rate], marker="*", markersize=10, color=shade, linestyle="none")
        ax.set_title(model_name(model))
        ax.set_xlabel(RANKS_LABEL)
        ax.set_ylabel("images/sec (all ranks)")
        _rank_axis(ax, xs_all if baselines else [p.ranks for p in mine])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    return _finish(fig)


def efficiency_series(points: list[Point]) -> dict[str, tuple[str, list[Point]]]:
    """Per model: which efficiency its bars show ("scaling", the field's definition, whenever the
    model has a single-rank baseline in the data; else "own", against each configuration's own
    smallest rank count) and the points drawn. Baselines themselves are not drawn: they are the
    100% line."""
    out = {}
    dist = _distributed(points)
    for model in _models(dist):
        mine = [p for p in dist if p.config.get("model") == model]
        scaled = [p for p in mine if p.efficiency is not None]
        if scaled:
            out[model] = ("scaling", scaled)
            continue
        # At its base rank count a configuration is 100% of itself by definition: larger counts.
        own = [
            p
            for p in mine
            if p.own_efficiency is not None and p.base_ranks is not None and p.ranks > p.base_ranks
        ]
        if own:
            out[model] = ("own", own)
    return out


def efficiency_bars(points: list[Point]) -> Figure | None:
    """Scaling efficiency per model and rank count, one bar per configuration, against the 100%
    line of a single rank without distribution. A model whose data has no such baseline shows the
    efficiency against its own smallest rank count instead, and says so on its axes."""
    series = efficiency_series(points)
    if not series:
        return None
    shown = [p for _, members in series.values() for p in members]
    title = EFFICIENCY_TITLE + " (dotted: 100%, linear scaling)"
    if all(kind == "own" for kind, _ in series.values()):
        title = (
            "Efficiency vs own smallest rank count (the data has no single rank without "
            "distribution; dotted: 100%, linear scaling)"
        )
    fig, axes = _grid(len(series), title, shown)
    for ax, (model, (kind, mine)) in zip(axes, series.items(), strict=True):

        def value(p: Point, kind=kind) -> float:
            return 100 * (p.efficiency if kind == "scaling" else p.own_efficiency)

        _bars(ax, mine, value, lambda p, value=value: f"{value(p):.0f}")
        ref = "single rank without distribution" if kind == "scaling" else "linear from smallest rank count"
        ax.axhline(100, color="black", linewidth=0.8, linestyle=":", label=f"100% = {ref}")
        _legend(ax)
        title = model_name(model)
        if kind == "own":
            title += "\n(no single-rank baseline: vs own smallest rank count)"
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(EFFICIENCY_AXIS if kind == "scaling" else OWN_EFFICIENCY_AXIS, fontsize=8)
        ax.set_ylim(0, max(110, max(value(p) for p in mine) * 1.1))
    return _finish(fig)


def _bars(ax, points: list[Point], value, text=None, mark_missing: bool = False) -> list:
    """Grouped bars per rank count, one colour per configuration; text(p) labels each bar.
    Returns [(configuration label, [(x, point, bar)])] for what was drawn."""
    cols, groups = _variants(points, exclude=("model",))
    ranks = sorted({p.ranks for p in points})
    n = max(len(groups), 1)
    width = 0.8 / n
    drawn = []
    for i, members in enumerate(groups.values()):
        by_ranks = {p.ranks: p for p in members}
        offset = (i - (n - 1) / 2) * width
        slots = [(j + offset, by_ranks[r]) for j, r in enumerate(ranks) if r in by_ranks]
        done = [(x, p) for x, p in slots if p.total is not None and value(p) is not None]
        name = label(members[0].config, cols)
        bars = ax.bar(
            [x for x, _ in done],
            [value(p) for _, p in done],
            width=width * 0.95,
            color=_COLORS[i % len(_COLORS)],
            label=name,
        )
        if text is not None and n <= 4:
            ax.bar_label(bars, labels=[text(p) for _, p in done], fontsize=7, padding=1)
        for x, p in slots:
            if p.total is None:  # every run of this point failed: say so where its bar would be
                ax.text(x, 0, " failed", rotation=90, ha="center", va="bottom", fontsize=7, color="#b00020")
        if mark_missing and n <= 4:
            for j, r in enumerate(ranks):
                if r not in by_ranks:
                    ax.text(
                        j + offset,
                        0,
                        " not run",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        color="#777",
                    )
        drawn.append((name, [(x, p, b) for (x, p), b in zip(done, bars, strict=True)]))
    ax.set_xticks(range(len(ranks)))
    ax.set_xticklabels([str(r) for r in ranks])
    ax.set_xlim(-0.5, len(ranks) - 0.5)
    ax.set_xlabel(RANKS_LABEL)
    ax.grid(True, axis="y", alpha=0.3)
    _legend(ax)
    return drawn


def comparison(
    points: list[Point], column: str, values: tuple[str, ...], title: str, also_ignore: tuple[str, ...] = ()
) -> Figure | None:
    """The Horovod paper's Figures 6 and 7 in kolo's style: per model, grouped bars of images/sec
    against GPUs for each of `values` of `column` (ring against ps, TCP against RDMA), the ideal
    line N × the images/sec of a single rank without distribution, and the scaling efficiency as
    a % label on each bar. Drawn when the data holds at least two of the values in otherwise equal
    configurations (`also_ignore` aside); a side that failed or did not run at some rank count is
    marked there, and without a baseline the ideal line and the labels are left out."""
    ok = paired([p for p in _distributed(points) if p.config.get(column) in values], column, also_ignore)
    if not any(p.total is not None for p in ok):
        return None
    models = _models(ok)
    has_base = any(p.baseline for p in ok)
    how = ": images/sec, % on the bars = scaling efficiency"
    fig, axes = _grid(len(models), title + (how if has_base else ": images/sec"), ok)
    for ax, model in zip(axes, models, strict=True):
        mine = [p for p in ok if p.config.get("model") == model]
        _bars(
            ax,
            mine,
            lambda p: p.total,
            lambda p: "" if p.efficiency is None else f"{100 * p.efficiency:.0f}%",
            mark_missing=True,
        )
        ranks = sorted({p.ranks for p in mine})
        baselines = _baselines(mine)
        for j, rate in enumerate(baselines):
            ax.plot(
                range(len(ranks)),
                [rate * r for r in ranks],
                linestyle="--",
                marker="_",
                markersize=14,
                color=("black", "#555555", "#999999")[j % 3],
                label=IDEAL_LABEL if len(baselines) == 1 else f"{IDEAL_LABEL}: {rate:.4g}/s × N",
            )
        if baselines:
            _legend(ax)
        ax.set_title(model_name(model))
        ax.set_ylabel("images/sec (all ranks)")
        ax.set_ylim(bottom=0)
    return _finish(fig)


def paired(points: list[Point], column: str, also_ignore: tuple[str, ...] = ()) -> list[Point]:
    """The points whose configuration, `column` and `also_ignore` aside, was also run with another
    value of `column` (for backend, the parameter server's own settings are set aside too)."""
    ignore = {column, *also_ignore} | (set(PS_ONLY) if column == "backend" else set())
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        key = tuple(v for k, v in sorted(p.config.items()) if k not in ignore)
        groups.setdefault(key, []).append(p)
    keep = {id(p) for g in groups.values() if len({p.config.get(column) for p in g}) >= 2 for p in g}
    return [p for p in points if id(p) in keep]


def has_breakdown(p: Point) -> bool:
    """Whether the point ran and its record says where each step's time went."""
    return p.total is not None and all(c in p.breakdown for c in schema.PHASES)


def breakdown_label(p: Point, cols: list[str]) -> str:
    """The bar's name in the breakdown figure: configuration and rank count."""
    if p.is_baseline:
        text = "1 rank, no distribution (baseline)"
        return text + (" (replay)" if p.replay else "")
    name = label(p.config, cols)
    if p.replay and "replay" not in name:
        name += " (replay)"
    return f"{name}, {p.ranks} rank{'s' if p.ranks != 1 else ''}"


def sentence_columns(points: list[Point]) -> list[str]:
    """The columns that name one model's configurations in words: the backend always, then the
    settings that tell them apart (label_columns)."""
    dist = _distributed(points)
    return ["backend", *(c for c in label_columns(dist, ("model", "backend")))]


def breakdown(points: list[Point]) -> Figure | None:
    """Where the time went: per model, one horizontal bar per configuration and rank count, the
    step's four phases stacked in ms (forward, backward, exposed communication, update; any rest
    of the step in grey), and the communication hidden under backward as a hatched strip inside
    the backward segment. Points without a breakdown (CSVs from before it was recorded, failed
    points) are left out; None when none has one."""
    shown = [p for p in points if has_breakdown(p)]
    if not shown:
        return None
    models = _models(shown)
    per_model = {m: [p for p in shown if p.config.get("model") == m] for m in models}
    for members in per_model.values():  # the baseline first, then each configuration by ranks
        members.sort(key=lambda p: not p.is_baseline)
    heights = [0.7, *(0.9 + 0.34 * len(v) for v in per_model.values())]  # the legend's row first
    fig, axes = plt.subplots(
        len(models) + 1,
        1,
        figsize=(10, sum(heights) + 1.6),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": heights},
    )
    key, axes = axes[0, 0], axes[1:]
    fig.suptitle(
        "Where the time went: each training step's phases (ms, mean over steps and ranks)",
        fontsize=12,
        fontweight="bold",
    )
    _replay_note(fig, shown)
    any_other = any_hidden = False
    for ax, (model, members) in zip(axes[:, 0], per_model.items(), strict=True):
        cols = sentence_columns(members)
        names = [breakdown_label(p, cols) for p in members]
        ends = []
        for y, p in enumerate(members):
            b = p.breakdown
            left = 0.0
            for phase, (_, color) in PHASE_STYLE.items():
                width = max(b[phase], 0.0)
                ax.barh(y, width, left=left, height=0.7, color=color)
                left += width
            step = b.get("step_time_ms_mean", left)
            if step - left > 0.01 * step:  # bookkeeping between the phases
                ax.barh(y, step - left, left=left, height=0.7, color=OTHER_COLOR)
                any_other = True
            hidden = min(max(b.get("hidden_comm_ms", 0.0), 0.0), b["backward_ms"])
            if hidden > 0:  # overlapped with backward: drawn inside it, ending where backward ends
                end = b["forward_ms"] + b["backward_ms"]
                ax.barh(
                    y,
                    hidden,
                    left=end - hidden,
                    height=0.34,
                    facecolor=(1, 1, 1, 0.35),
                    edgecolor=HIDDEN_COLOR,
                    hatch="////",
                    linewidth=0.6,
                )
                any_hidden = True
            end = max(step, left)
            note = f" {step:.1f} ms"
            if p.efficiency is not None and not p.is_baseline:
                note += f" · {100 * p.efficiency:.0f}% efficiency"
            ax.text(end, y, note, va="center", ha="left", fontsize=7)
            ends.append(end)
        ax.set_yticks(range(len(members)))
        ax.set_yticklabels([textwrap.fill(n, width=_LEGEND_LINE_CHARS) for n in names], fontsize=8)
        ax.set_ylim(len(members) - 0.5, -0.5)
        ax.set_xlim(0, max(ends) * 1.3)
        ax.set_title(model_name(model), fontsize=10, loc="left")
        ax.set_xlabel("ms per training step", fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
    handles = [Patch(color=color, label=name) for name, color in PHASE_STYLE.values()]
    if any_other:
        handles.append(Patch(color=OTHER_COLOR, label="rest of the step (between phases)"))
    if any_hidden:
        handles.append(
            Patch(
                facecolor="white",
                edgecolor=HIDDEN_COLOR,
                hatch="////",
                label="communication hidden under backward (overlapped)",
            )
        )
    key.axis("off")
    key.legend(handles=handles, loc="center", ncol=3, fontsize=8, frameon=False)
    return fig


def knob_curve(points: list[Point], column: str) -> Figure | None:
    """Images/sec against one engine knob (fusion threshold, cycle time, backward passes per
    step) per model, one line per rank count and other configuration; only lines that cover at
    least two values of the knob are drawn."""
    ok = [p for p in _distributed(points) if p.total is not None and p.config.get(column, "") != ""]
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
        ax.set_title(model_name(model))
        ax.set_xlabel(axis_label)
        ax.set_ylabel("images/sec (all ranks)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    return _finish(fig)


def all_figures(points: list[Point]) -> list[tuple[str, str, Figure]]:
    """(file stem, caption, figure) for every figure the data supports, in report order. The
    report shows "efficiency" and "breakdown" side by side."""
    series = efficiency_series(points)
    kinds = {kind for kind, _ in series.values()}
    eff_caption = (
        "Scaling efficiency: images/sec per GPU ÷ images/sec of one rank training without "
        "distribution (kolo-train --backend none, same model, batch, compute and precision); "
        "100% = linear scaling"
    )
    if kinds == {"own"}:
        eff_caption = (
            "Efficiency vs own smallest rank count (the data has no single-rank run without "
            "distribution, so no scaling efficiency): images/sec per GPU ÷ that of the same "
            "configuration at its smallest rank count"
        )
    elif "own" in kinds:
        eff_caption += "; models without that baseline show efficiency vs own smallest rank count"
    paper = "; % on each bar: scaling efficiency; dashed: ideal = N × single rank without distribution"
    out = []
    candidates = [
        (
            "scaling",
            "Images/sec against GPUs; dashed: the ideal, N × the images/sec of one rank training "
            "without distribution (backend none)",
            scaling(points),
        ),
        ("efficiency", eff_caption, efficiency_bars(points)),
        (
            "breakdown",
            "Where the time went: forward, backward, exposed communication and update per step, "
            "for each configuration and rank count; hatched: communication hidden under backward",
            breakdown(points),
        ),
        (
            "ring-vs-ps",
            "Ring-allreduce against the parameter server: images/sec per GPU count" + paper,
            comparison(points, "backend", ("ring", "ps"), "Ring-allreduce against parameter server"),
        ),
        (
            "backends",
            "Every collective backend side by side" + paper,
            # MPI and NCCL have no kolo transport: compare them with the ring over any transport.
            comparison(points, "backend", ("ring", "mpi", "nccl"), "Collective backends", ("transport",)),
        ),
        (
            "tcp-vs-rdma",
            "TCP against RDMA: images/sec per GPU count" + paper,
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
