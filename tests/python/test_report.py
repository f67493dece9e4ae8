"""Plots and the HTML page from the checked-in fixture CSV, read as a CSV from before the time
breakdown and the single-rank baseline (tests/python/test_report_breakdown.py has those)."""

import csv
import io
import re
import struct

import pytest
from reports import efficiency, plots, report, schema

from conftest import FIXTURES, run_cli


def legacy_rows() -> list[dict]:
    """The fixture's rows in the current columns, as an old sweep holds them: no breakdown, no
    baseline rows, nothing derived (whatever the fixture's header is now)."""
    with open(FIXTURES / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    blank = set(schema.BREAKDOWN) | set(efficiency.DERIVED)
    return [
        {c: "" if c in blank else r.get(c, "") for c in schema.COLUMNS}
        for r in rows
        if r["backend"] != "none"
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    schema.write_rows(str(out / "results.csv"), legacy_rows())
    result = run_cli("report", str(out))
    assert result.returncode == 0, result.stderr
    return out


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_every_supported_figure_as_png_and_svg(built):
    names = sorted(p.name for p in (built / "report" / "plots").iterdir())
    stems = ["efficiency", "fusion", "ring-vs-ps", "scaling", "tcp-vs-rdma"]
    assert names == sorted([f"{s}.png" for s in stems] + [f"{s}.svg" for s in stems])
    for stem in stems:
        width, height = png_size(built / "report" / "plots" / f"{stem}.png")
        assert width >= 400 and height >= 300
        assert "<svg" in (built / "report" / "plots" / f"{stem}.svg").read_text()[:2000]


def test_html_is_offline_and_links_what_exists(built):
    page = (built / "report" / "index.html").read_text()
    assert "http://" not in page and "https://" not in page
    for src in re.findall(r"(?:src|href)='([^']+)'", page):
        if not src.startswith("../points/"):  # logs live with the sweep, not with the fixture
            assert (built / "report" / src).resolve().exists(), src


def test_html_labels_replay_and_lists_the_failure(built):
    page = (built / "report" / "index.html").read_text()
    assert "<span class='replay'>replay</span>" in page
    assert "not measured GPU throughput" in page
    assert "Failed points" in page and "timed out after 600 s" in page
    assert "ring-allreduce over parameter server" in page


def test_replay_note_is_on_the_figures():
    rows = efficiency.with_efficiency(legacy_rows())
    fig = plots.scaling(efficiency.aggregate(rows))
    texts = [fig._supxlabel.get_text()] if fig._supxlabel is not None else []
    assert any("REPLAY" in t for t in texts)


def test_figures_only_when_the_data_has_them():
    rows = [
        r for r in legacy_rows() if r["ranks"] == "4" and r["backend"] == "ring" and r["transport"] == "tcp"
    ]
    points = efficiency.aggregate(efficiency.with_efficiency(rows))
    stems = [stem for stem, _, _ in plots.all_figures(points)]
    # One rank count: no scaling or efficiency; one backend and transport: no comparison.
    assert stems == ["fusion"]


def test_ratios_pair_ring_with_each_ps_variant():
    rows = efficiency.with_efficiency(legacy_rows())
    found = report.ratios(efficiency.aggregate(rows), "backend", "ring", "ps")
    by = {(c["model"], r): round(x, 3) for c, r, x in found}
    assert by[("resnet101", 8)] == round(680 / 384, 3)
    assert ("vgg16", 8) not in by  # the ps point failed


def test_missing_csv_is_an_error(tmp_path):
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 2
    assert "results.csv does not exist" in result.stderr


def test_many_configurations_and_long_labels_keep_their_axes(recwarn):
    # Dozens of configurations per model, each named by many settings: the legends wrap and the
    # figure grows to hold them, instead of constrained layout squeezing the axes to nothing.
    rows = []
    for r in legacy_rows():
        for k in range(6):
            rows.append(
                dict(
                    r,
                    point_id=f"{r['point_id']}-{k}",
                    cycle_time_ms=str(1 + k),
                    profile=f"models/profiles/a-very-long-profile-name-{k}-recorded-somewhere.json",
                    calibration=f"sim/calibrations/a-long-calibration-name-{k % 2}.json",
                )
            )
    points = efficiency.aggregate(efficiency.with_efficiency(rows))
    fig = plots.scaling(points)
    legend = fig.axes[0].get_legend()
    assert len(legend.get_texts()) > 15
    assert all(
        len(line) <= plots._LEGEND_LINE_CHARS for t in legend.get_texts() for line in t.get_text().split("\n")
    )
    fig.savefig(io.BytesIO(), format="png", dpi=40)
    assert not [w for w in recwarn if "constrained_layout not applied" in str(w.message)]
    assert fig.axes[0].get_position().height > 0.1
