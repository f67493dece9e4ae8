"""Scaling efficiency and the grouping of rows into configurations.

A configuration is every setting of a row except the rank and node counts: rows that differ only
in how many ranks ran belong to one scaling curve.

Scaling efficiency is measured as the field defines it (the Horovod paper, tf_cnn_benchmarks):
against the throughput of one rank that does no distributed communication at all (kolo-train
--backend none), the same denominator for every backend, transport and knob of the same model,
batch, compute and precision:

    scaling_efficiency(N) = (T(N) / N) / T_none,   T_none = baseline images/sec (mean over repeats)

with T the total images/sec of the row. 1.0 is linear scaling. The baseline is found among the
rows with backend "none" and ranks 1 whose BASELINE_COLUMNS equal the row's; the sweep runner adds
that point to every sweep that lacks it.

The second, relative figure, efficiency_vs_own_base, divides by the same configuration at its own
smallest rank count b that succeeded: (T(N) / N) / (T(b) / b). It says how a configuration scales
from where it starts, not how it compares with training without distribution.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from reports import schema, settings

CONFIG_COLUMNS = tuple(c for c in schema.SETTING_COLUMNS if c not in ("ranks", "nodes"))
BASELINE_COLUMNS = settings.BASELINE_SETTINGS  # rows equal in these share one baseline
BASELINE_BACKEND = settings.BASELINE_BACKEND
# The columns with_efficiency fills.
DERIVED = ("scaling_efficiency", "baseline_images_per_sec", "efficiency_vs_own_base", "efficiency_base_ranks")


def config_key(row: dict) -> tuple:
    return tuple(row.get(c, "") for c in CONFIG_COLUMNS)


def baseline_key(row: dict) -> tuple:
    return tuple(row.get(c, "") for c in BASELINE_COLUMNS)


def is_baseline(row: dict) -> bool:
    """A single-rank row without distributed communication."""
    return row.get("backend") == BASELINE_BACKEND and schema.number(row, "ranks") == 1


def per_rank_rate(row: dict) -> float | None:
    total = schema.number(row, "total_images_per_sec")
    ranks = schema.number(row, "ranks")
    if total is None or not ranks:
        return None
    return total / ranks


def with_efficiency(rows: list[dict]) -> list[dict]:
    """Copies of `rows` with scaling_efficiency and baseline_images_per_sec filled in for every ok
    row that has an ok baseline, and efficiency_vs_own_base and efficiency_base_ranks for every ok
    row whose configuration has an ok row at some rank count (failed rows get empty cells)."""
    own = base_rates(rows)
    baselines = baseline_rates(rows)
    out = []
    for row in rows:
        row = dict(row)
        for c in DERIVED:
            row[c] = ""
        rate = per_rank_rate(row) if row.get("status") == "ok" else None
        if rate is not None:
            base = own.get(config_key(row))
            if base is not None and base[1] > 0:
                row["efficiency_vs_own_base"] = f"{rate / base[1]:.4f}"
                row["efficiency_base_ranks"] = str(base[0])
            single = baselines.get(baseline_key(row))
            if single is not None and single > 0:
                row["scaling_efficiency"] = f"{rate / single:.4f}"
                row["baseline_images_per_sec"] = schema.cell(single)
        out.append(row)
    return out


def baseline_rates(rows: list[dict]) -> dict[tuple, float]:
    """For each BASELINE_COLUMNS key: the mean images/sec of its ok single-rank rows without
    distributed communication."""
    rates: dict[tuple, list[float]] = {}
    for row in rows:
        if row.get("status") != "ok" or not is_baseline(row):
            continue
        rate = per_rank_rate(row)
        if rate is not None:
            rates.setdefault(baseline_key(row), []).append(rate)
    return {k: statistics.fmean(v) for k, v in rates.items()}


def base_rates(rows: list[dict]) -> dict[tuple, tuple[int, float]]:
    """For each configuration: (smallest ok rank count, mean per-rank images/sec there)."""
    by_config: dict[tuple, dict[int, list[float]]] = {}
    for row in rows:
        if row.get("status") != "ok":
            continue
        rate = per_rank_rate(row)
        if rate is None:
            continue
        ranks = int(schema.number(row, "ranks"))
        by_config.setdefault(config_key(row), {}).setdefault(ranks, []).append(rate)
    out = {}
    for key, per_ranks in by_config.items():
        b = min(per_ranks)
        out[key] = (b, statistics.fmean(per_ranks[b]))
    return out


@dataclass
class Point:
    """One configuration at one rank count, over its repeats."""

    config: dict  # CONFIG_COLUMNS -> value (strings, as in the CSV)
    ranks: int
    nodes: str
    ok: int  # repeats that succeeded
    failed: int
    total: float | None  # mean total images/sec over ok repeats
    total_spread: float | None  # stddev over repeats, else the run's own step-to-step stddev
    per_rank: float | None
    efficiency: float | None  # scaling_efficiency: against the single-rank baseline
    baseline: float | None  # the baseline's images/sec (per rank), efficiency's denominator
    own_efficiency: float | None  # efficiency_vs_own_base
    base_ranks: int | None  # the rank count own_efficiency is measured against
    errors: list[str]
    # schema.BREAKDOWN column -> mean over the ok repeats (columns no repeat has are left out)
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def replay(self) -> bool:
        return self.config.get("compute") == "replay"

    @property
    def is_baseline(self) -> bool:
        return self.config.get("backend") == BASELINE_BACKEND and self.ranks == 1


def aggregate(rows: list[dict]) -> list[Point]:
    """Groups rows (after with_efficiency) by configuration and rank count, in first-seen order
    of configuration and ascending rank count."""
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for row in rows:
        ranks = int(schema.number(row, "ranks") or 0)
        groups.setdefault(config_key(row), {}).setdefault(ranks, []).append(row)
    points = []
    for key, per_ranks in groups.items():
        for ranks in sorted(per_ranks):
            members = per_ranks[ranks]
            good = [r for r in members if r["status"] == "ok"]
            totals = [schema.number(r, "total_images_per_sec") for r in good]
            totals = [t for t in totals if t is not None]
            effs = _numbers(good, "scaling_efficiency")
            own = _numbers(good, "efficiency_vs_own_base")
            baseline = _numbers(good, "baseline_images_per_sec")
            bases = [schema.number(r, "efficiency_base_ranks") for r in good]
            bases = [b for b in bases if b is not None]
            if len(totals) > 1:
                spread = statistics.stdev(totals)
            elif good:
                # One run: its step-to-step stddev of per-rank rate, scaled to the job.
                s = schema.number(good[0], "images_per_sec_stddev")
                spread = s * ranks if s is not None else None
            else:
                spread = None
            total = statistics.fmean(totals) if totals else None
            points.append(
                Point(
                    config=dict(zip(CONFIG_COLUMNS, key, strict=True)),
                    ranks=ranks,
                    nodes=members[-1].get("nodes", ""),
                    ok=len(good),
                    failed=len(members) - len(good),
                    total=total,
                    total_spread=spread,
                    per_rank=total / ranks if total is not None and ranks else None,
                    efficiency=statistics.fmean(effs) if effs else None,
                    baseline=statistics.fmean(baseline) if baseline else None,
                    own_efficiency=statistics.fmean(own) if own else None,
                    base_ranks=int(bases[0]) if bases else None,
                    errors=[r["error"] for r in members if r["status"] != "ok" and r["error"]],
                    breakdown={c: statistics.fmean(v) for c in schema.BREAKDOWN if (v := _numbers(good, c))},
                )
            )
    return points


def _numbers(rows: list[dict], column: str) -> list[float]:
    values = [schema.number(r, column) for r in rows]
    return [v for v in values if v is not None]


def varying(points: list[Point], exclude: tuple[str, ...] = ()) -> list[str]:
    """The configuration columns whose value differs between points (minus `exclude`)."""
    out = []
    for c in CONFIG_COLUMNS:
        if c in exclude:
            continue
        if len({p.config.get(c, "") for p in points}) > 1:
            out.append(c)
    return out


def label(config: dict, columns: list[str]) -> str:
    """A legend label naming `columns` of `config`, with replay said outright."""
    parts = []
    for c in columns:
        value = config.get(c, "")
        if value == "":
            continue
        if c == "profile":
            value = value.rsplit("/", 1)[-1]
        parts.append(f"{SHORT.get(c, c)}={value}" if c not in ("backend", "transport", "model") else value)
    text = " ".join(p for p in parts if p) or "all"
    if config.get("compute") == "replay" and "compute" not in columns:
        text += " (replay)"
    return text


SHORT = {
    "fusion_threshold_mb": "fusion MiB",
    "cycle_time_ms": "cycle ms",
    "backward_passes_per_step": "bpps",
    "batch_size": "batch",
    "ps_servers": "servers",
    "ps_placement": "placement",
    "ps_pacing": "pacing",
    "ranks_per_host": "ranks/host",
    "link_represented": "stands for",
}
