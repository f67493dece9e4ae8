"""Scaling efficiency and the grouping of rows into configurations.

A configuration is every setting of a row except the rank and node counts: rows that differ only
in how many ranks ran belong to one scaling curve. The efficiency of a row is its throughput per
rank over the per-rank throughput of the same configuration at the smallest rank count that
succeeded:

    efficiency(N) = (T(N) / N) / (T(b) / b),   b = smallest ok rank count of the configuration,

with T the total images/sec (the mean over repeats at the base). 1.0 is linear scaling.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from reports import schema

CONFIG_COLUMNS = tuple(c for c in schema.SETTING_COLUMNS if c not in ("ranks", "nodes"))


def config_key(row: dict) -> tuple:
    return tuple(row.get(c, "") for c in CONFIG_COLUMNS)


def per_rank_rate(row: dict) -> float | None:
    total = schema.number(row, "total_images_per_sec")
    ranks = schema.number(row, "ranks")
    if total is None or not ranks:
        return None
    return total / ranks


def with_efficiency(rows: list[dict]) -> list[dict]:
    """Copies of `rows` with scaling_efficiency and efficiency_base_ranks filled in for every ok
    row whose configuration has an ok row at some rank count (failed rows get empty cells)."""
    bases = base_rates(rows)
    out = []
    for row in rows:
        row = dict(row)
        row["scaling_efficiency"] = ""
        row["efficiency_base_ranks"] = ""
        rate = per_rank_rate(row) if row.get("status") == "ok" else None
        base = bases.get(config_key(row))
        if rate is not None and base is not None and base[1] > 0:
            row["scaling_efficiency"] = f"{rate / base[1]:.4f}"
            row["efficiency_base_ranks"] = str(base[0])
        out.append(row)
    return out


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
    efficiency: float | None
    base_ranks: int | None  # the rank count efficiency is measured against
    errors: list[str]

    @property
    def replay(self) -> bool:
        return self.config.get("compute") == "replay"


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
            effs = [schema.number(r, "scaling_efficiency") for r in good]
            effs = [e for e in effs if e is not None]
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
                    base_ranks=int(bases[0]) if bases else None,
                    errors=[r["error"] for r in members if r["status"] != "ok" and r["error"]],
                )
            )
    return points


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
}
