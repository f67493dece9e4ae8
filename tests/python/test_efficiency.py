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


def base(total, **config):
    """The single-rank baseline without distribution (backend none)."""
    return row(1, total, backend="none", **config)


def effs(rows, column="scaling_efficiency"):
    return [r[column] for r in efficiency.with_efficiency(rows)]


def test_efficiency_against_the_single_rank_baseline():
    # 100 img/s without distribution; 95 on 1 ring rank -> 0.95; 190 on 2 -> 0.95; 340 on 4 -> 0.85.
    assert effs([base(100), row(1, 95), row(2, 190), row(4, 340)]) == [
        "1.0000",
        "0.9500",
        "0.9500",
        "0.8500",
    ]
    assert effs([base(100), row(1, 95)], "baseline_images_per_sec") == ["100", "100"]


def test_every_backend_divides_by_the_same_baseline():
    # The issue this definition settles: a parameter server slow already at one worker must not
    # look like it scales better than a ring that is faster at every rank count.
    rows = [
        base(1000),
        row(1, 1000),
        row(4, 1100),
        row(1, 100, backend="ps"),
        row(4, 150, backend="ps"),
    ]
    got = [float(e) for e in effs(rows)]
    assert got == pytest.approx([1.0, 1.0, 0.275, 0.1, 0.0375])
    assert got[2] > got[4]  # ring ahead in throughput at 4 ranks, so ahead in efficiency
    # The relative figure would say the opposite (0.275 against 0.375), and is named as such.
    own = [float(e) for e in effs(rows, "efficiency_vs_own_base")]
    assert own[2] == pytest.approx(0.275) and own[4] == pytest.approx(0.375)


def test_no_baseline_no_efficiency():
    rows = efficiency.with_efficiency([row(1, 100), row(2, 190)])
    assert [r["scaling_efficiency"] for r in rows] == ["", ""]
    assert [r["efficiency_vs_own_base"] for r in rows] == ["1.0000", "0.9500"]


def test_a_failed_baseline_gives_no_efficiency():
    assert effs([base(None, status="failed"), row(2, 190)]) == ["", ""]


def test_baselines_are_per_model_batch_compute_and_precision():
    rows = [
        base(100),
        base(50, batch_size="128"),
        base(10, model="vgg16"),
        row(2, 190, fusion_threshold_mb="0"),  # engine knobs share the baseline
        row(2, 90, batch_size="128"),
        row(2, 15, model="vgg16"),
        row(2, 150, precision="fp16"),  # no baseline of its own precision
    ]
    assert effs(rows)[3:] == ["0.9500", "0.9000", "0.7500", ""]


def test_own_base_is_the_smallest_ok_rank_count_and_named():
    rows = efficiency.with_efficiency([row(1, None, status="failed"), row(2, 200), row(4, 300)])
    assert [r["efficiency_vs_own_base"] for r in rows] == ["", "1.0000", "0.7500"]
    assert [r["efficiency_base_ranks"] for r in rows] == ["", "2", "2"]


def test_repeats_average_at_the_baseline():
    rows = [base(90), base(110), row(4, 360)]
    assert effs(rows)[2] == "0.9000"  # 360 / (4 * mean(90, 110))


def test_aggregate_means_and_spread():
    rows = efficiency.with_efficiency([base(100), row(1, 90), row(1, 110), row(2, 190)])
    points = efficiency.aggregate(rows)
    assert [(p.config["backend"], p.ranks, p.total, p.ok) for p in points] == [
        ("none", 1, 100.0, 1),
        ("ring", 1, 100.0, 2),
        ("ring", 2, 190.0, 1),
    ]
    assert points[0].is_baseline and not points[1].is_baseline
    assert points[1].total_spread == pytest.approx(14.1421356, rel=1e-6)  # stdev of 90, 110
    assert points[2].efficiency == pytest.approx(0.95)
    assert points[2].baseline == pytest.approx(100.0)
    assert points[2].per_rank == pytest.approx(95.0)


def test_aggregate_means_the_breakdown():
    rows = [base(100), row(2, 190, forward_ms="10", comm_ms="4"), row(2, 190, forward_ms="20")]
    rows[2]["point_id"] = "again"
    points = efficiency.aggregate(efficiency.with_efficiency(rows))
    assert points[1].breakdown == {"forward_ms": 15.0, "comm_ms": 4.0}


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
    # The fixture's baseline runs as fast as its single ring rank.
    assert ring_tcp == pytest.approx({1: 1.0, 2: 0.95, 4: 0.90, 8: 0.85})
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["scaling_efficiency"] == ""
