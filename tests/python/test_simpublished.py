"""reports.simpublished: the points file is checked before any prediction, and the errors are the
predicted less the published efficiency, in points."""

import json
import re

import pytest

from reports import simpublished


def _doc(**point):
    p = dict(model="resnet101", ranks=128, backend="nccl", transport="tcp", efficiency=0.88,
             source="a paper")  # fmt: skip
    p.update(point)
    return {"settings": {"gpu_rate": {"resnet101": 130.0}}, "points": [p]}


def test_the_committed_points_file_is_well_formed_and_cites_every_point():
    doc = simpublished.load_points("sim/published/horovod.json")
    assert len(doc["points"]) >= 8
    for p in doc["points"]:
        assert p["source"].strip()
        assert 0 < p["efficiency"] <= 1


@pytest.mark.parametrize(
    "point, fragment",
    [
        (dict(efficiency=1.2), "outside (0, 1]"),
        (dict(backend="gloo"), "allowed: nccl, ring, ps"),
        (dict(source=" "), "empty source"),
        (dict(model="vgg16"), "no settings.gpu_rate for vgg16"),
    ],
)
def test_bad_points_are_refused_naming_the_value(tmp_path, point, fragment):
    path = tmp_path / "points.json"
    path.write_text(json.dumps(_doc(**point)))
    with pytest.raises(ValueError, match=re.escape(fragment)):
        simpublished.load_points(str(path))


def test_missing_fields_and_empty_lists_are_refused(tmp_path):
    path = tmp_path / "points.json"
    doc = _doc()
    del doc["points"][0]["source"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="lacks source"):
        simpublished.load_points(str(path))
    path.write_text(json.dumps({"points": []}))
    with pytest.raises(ValueError, match="non-empty list"):
        simpublished.load_points(str(path))


def test_errors_table_and_summary():
    rows = [
        dict(
            model="a",
            ranks=128,
            backend="nccl",
            transport="tcp",
            efficiency=0.88,
            predicted=0.90,
            error_points=2.0,
        ),  # fmt: skip
        dict(
            model="b",
            ranks=512,
            backend="ps",
            transport="tcp",
            efficiency=0.5,
            predicted=0.25,
            error_points=-25.0,
        ),  # fmt: skip
        dict(
            model="c",
            ranks=16,
            backend="nccl",
            transport="rdma",
            efficiency=0.9,
            predicted=0.86,
            error_points=-4.0,
        ),  # fmt: skip
    ]
    assert "median absolute error 4.0 points" in simpublished.summary(rows)
    assert "worst 25.0" in simpublished.summary(rows)
    assert "2 of 3 within 5 points" in simpublished.summary(rows)
    t = simpublished.table(rows)
    assert "| a | 128 | nccl | tcp | 0.88 | 0.90 | +2.0 |" in t
    assert "| b | 512 | ps | tcp | 0.50 | 0.25 | -25.0 |" in t


def test_sim_arguments_carry_the_files_settings():
    doc = _doc(backend="ps")
    args = simpublished.sim_args(doc, doc["points"][0], "/tmp/x.json", 0.01)
    assert args[:3] == ["predict", "--model", "resnet101"]
    assert args[args.index("--gpu-rate") + 1] == "130.0"
    assert "--ps-servers" in args and args[args.index("--step-jitter") + 1] == "0.01"
