"""Scaling-efficiency arithmetic against hand-computed values."""

import pytest
from reports import efficiency, schema

from conftest import FIXTURES


def row(ranks, total, status="ok", **config):
    r = {c: "" for c in schema.COLUMNS}
    r.update(model="resnet101", backend="ring", batch_size="64", status=status, point_id=f"{ranks}-{total}")
    r.update(config)
    r.update(ranks=str(ranks), total_images_per_sec="" if total is None else str(total))
    return r


def effs(rows):
    return [r["scaling_efficiency"] for r in efficiency.with_efficiency(rows)]


def test_efficiency_against_the_smallest_rank_count():
    # 100 img/s on 1 rank; 190 on 2 -> 0.95; 360 on 4 -> 0.90; 680 on 8 -> 0.85.
    assert effs([row(1, 100), row(2, 190), row(4, 360), row(8, 680)]) == [
        "1.0000",
        "0.9500",
        "0.9000",
        "0.8500",
    ]


def test_base_is_the_smallest_ok_rank_count_and_named():
    rows = efficiency.with_efficiency([row(1, None, status="failed"), row(2, 200), row(4, 300)])
    assert [r["scaling_efficiency"] for r in rows] == ["", "1.0000", "0.7500"]
    assert [r["efficiency_base_ranks"] for r in rows] == ["", "2", "2"]


def test_configurations_are_separate():
    rows = [
        row(1, 100),
        row(2, 150),
        row(1, 80, backend="ps"),
        row(2, 80, backend="ps"),
        row(2, 400, batch_size="128"),
    ]
    # ps: (80/2)/(80/1) = 0.5; batch 128 has only 2 ranks, its own base.
    assert effs(rows) == ["1.0000", "0.7500", "1.0000", "0.5000", "1.0000"]


def test_repeats_average_at_the_base():
    rows = [row(1, 90), row(1, 110), row(4, 360)]
    assert effs(rows)[2] == "0.9000"  # 360 / (4 * mean(90, 110))


def test_aggregate_means_and_spread():
    rows = efficiency.with_efficiency([row(1, 90), row(1, 110), row(2, 190)])
    points = efficiency.aggregate(rows)
    assert [(p.ranks, p.total, p.ok) for p in points] == [(1, 100.0, 2), (2, 190.0, 1)]
    assert points[0].total_spread == pytest.approx(14.1421356, rel=1e-6)  # stdev of 90, 110
    assert points[1].efficiency == pytest.approx(0.95)
    assert points[1].per_rank == pytest.approx(95.0)


def test_fixture_efficiencies():
    rows = efficiency.with_efficiency(schema.read_rows(str(FIXTURES / "results.csv")))
    ring_tcp = {
        int(r["ranks"]): float(r["scaling_efficiency"])
        for r in rows
        if r["model"] == "resnet101"
        and r["backend"] == "ring"
        and r["transport"] == "tcp"
        and r["fusion_threshold_mb"] == "64"
    }
    assert ring_tcp == pytest.approx({1: 1.0, 2: 0.95, 4: 0.90, 8: 0.85})
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["scaling_efficiency"] == ""
