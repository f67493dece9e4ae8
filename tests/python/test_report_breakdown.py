"""The report against the single-rank baseline, with the time breakdown: a realistic sweep built
with schema.make_row (baselines without distribution, ring and parameter server at 1, 2 and 4
ranks where the parameter server is slower, RDMA, a replay configuration bound by negotiation, a
failed point), and the same sweep as an old CSV without breakdown or baselines."""

import re
from html.parser import HTMLParser

import pytest
from reports import efficiency, plots, report, schema

from conftest import run_cli

# One rank's compute per step, ms (forward, backward, update), per model: the baseline without
# distribution runs exactly this; distributed points add their exposed communication.
COMPUTE = {
    "vgg16": (100.0, 200.0, 20.0),
    "resnet101": (70.0, 133.3, 10.0),
    "inception3": (140.0, 276.7, 10.0),
}
BATCH = 64
VGG_GRAD = 138.4e6 * 4  # bytes of VGG-16's gradients (fp32)
RESNET_GRAD = 44.5e6 * 4


def ring_bytes(grad: float, ranks: int) -> float:
    return 2 * (ranks - 1) / ranks * grad  # what each rank sends in a ring allreduce


# (model, backend, transport, ranks, total images/sec, comm ms, negotiation ms, bytes sent per
# rank per step, update ms or None for the model's own); exposed comm is what the step has beyond
# compute, hidden = comm - exposed. The parameter server is slower at every rank count, yet from
# its own slow single rank VGG-16's scales better than the ring: only the field's efficiency
# orders the two as their throughput does.
POINTS = [
    ("vgg16", "none", "", 1, 200.0, 0.0, 0.0, 0.0, None),
    ("vgg16", "ring", "tcp", 1, 196.0, 8.0, 6.0, 2e3, None),
    ("vgg16", "ring", "tcp", 2, 300.0, 250.0, 3.0, ring_bytes(VGG_GRAD, 2), None),
    ("vgg16", "ring", "tcp", 4, 360.0, 500.0, 5.0, ring_bytes(VGG_GRAD, 4), None),
    ("vgg16", "ps", "tcp", 1, 120.0, 300.0, 0.0, VGG_GRAD, 10.0),
    ("vgg16", "ps", "tcp", 2, 200.0, 420.0, 0.0, VGG_GRAD, 10.0),
    ("vgg16", "ps", "tcp", 4, 280.0, 700.0, 0.0, VGG_GRAD, 10.0),
    ("resnet101", "none", "", 1, 300.0, 0.0, 0.0, 0.0, None),
    ("resnet101", "ring", "tcp", 1, 294.0, 6.0, 2.0, 1e3, None),
    ("resnet101", "ring", "tcp", 2, 570.0, 40.0, 2.0, ring_bytes(RESNET_GRAD, 2), None),
    ("resnet101", "ring", "tcp", 4, 1080.0, 80.0, 3.0, ring_bytes(RESNET_GRAD, 4), None),
    ("resnet101", "ring", "rdma", 1, 296.0, 5.0, 2.0, 1e3, None),
    ("resnet101", "ring", "rdma", 2, 580.0, 30.0, 2.0, ring_bytes(RESNET_GRAD, 2), None),
    ("resnet101", "ring", "rdma", 4, 1120.0, 50.0, 3.0, ring_bytes(RESNET_GRAD, 4), None),
    ("resnet101", "ps", "tcp", 1, 240.0, 80.0, 0.0, RESNET_GRAD, 5.0),
    ("resnet101", "ps", "tcp", 2, 440.0, 110.0, 0.0, RESNET_GRAD, 5.0),
    ("resnet101", "ps", "tcp", 4, 760.0, 160.0, 0.0, RESNET_GRAD, 5.0),
    ("inception3", "none", "", 1, 150.0, 0.0, 0.0, 0.0, None),
    ("inception3", "ring", "tcp", 1, 148.0, 4.0, 3.0, 1e3, None),
    ("inception3", "ring", "tcp", 2, 128.0, 600.0, 400.0, ring_bytes(95e6, 2), None),
]
FAILED = ("resnet101", "ps", "tcp", 8)
REPLAY = {"inception3"}


def _point(model, backend, transport, ranks, i):
    point = {
        "point_id": f"p{i:04d}",
        "repeat": 0,
        "model": model,
        "batch_size": BATCH,
        "ranks": ranks,
        "backend": backend,
        "compute": "replay" if model in REPLAY else "cudnn",
        "precision": "fp32",
        "num_warmup_batches": 2,
        "num_batches": 20,
    }
    if model in REPLAY:
        point["profile"] = f"models/profiles/{model}-h100-b64.json"
    if transport:
        point["transport"] = transport
    if backend != "none":
        point.update(fusion_threshold_mb=64, cycle_time_ms=1)
    if backend == "ps":
        point.update(ps_servers=1, ps_placement="greedy")
    return point


def _results(model, backend, ranks, total, comm, negotiation, nbytes, update):
    fwd, bwd, own_update = COMPUTE[model]
    update = own_update if update is None else update
    step = BATCH * 1000.0 / (total / ranks)
    exposed = step - fwd - bwd - update
    if backend == "none":  # no communication: the step is compute
        bwd, exposed = bwd + exposed, 0.0
    return {
        "total_images_per_sec": total,
        "images_per_sec_per_rank": total / ranks,
        "images_per_sec_stddev": 1.0,
        "step_time_ms_median": step,
        "step_time_ms_mean": step,
        "forward_ms": fwd,
        "backward_ms": bwd,
        "exposed_comm_ms": exposed,
        "update_ms": update,
        "comm_ms": comm,
        "hidden_comm_ms": max(0.0, comm - exposed),
        "negotiation_ms": negotiation,
        "comm_bytes_per_step": nbytes,
        "comm_gbytes_per_sec": nbytes / comm / 1e6 if comm else 0.0,
        "kernel_share": 0.8,
    }


def sweep_rows() -> list[dict]:
    rows = []
    for i, (model, backend, transport, ranks, total, comm, neg, nbytes, update) in enumerate(POINTS):
        point = _point(model, backend, transport, ranks, i)
        record = {
            "timestamp": "2026-01-01T00:00:00Z",
            "kolo_commit": "0123abc",
            "hosts": ["node1"],
            "cpu_model": "Fixture CPU",
            "gpu_model": "Fixture GPU",
            "settings": {"nodes": 1},
            "results": _results(model, backend, ranks, total, comm, neg, nbytes, update),
        }
        rows.append(schema.make_row(point, record, run_id="r1", status="ok", duration_s=30.0))
    model, backend, transport, ranks = FAILED
    rows.append(
        schema.make_row(
            _point(model, backend, transport, ranks, len(POINTS)),
            None,
            run_id="r1",
            status="failed",
            error="timed out after 600 s",
            nodes=1,
            log="points/p0099/log.txt",
        )
    )
    return rows


def old_rows() -> list[dict]:
    """The same sweep as a CSV from before the breakdown and the baseline: no backend none rows,
    empty breakdown and derived cells."""
    blank = set(schema.BREAKDOWN) | set(efficiency.DERIVED)
    return [
        {c: ("" if c in blank else v) for c, v in r.items()} for r in sweep_rows() if r["backend"] != "none"
    ]


def build(tmp_path, rows):
    schema.write_rows(str(tmp_path / "results.csv"), rows)
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 0, result.stderr
    return tmp_path / "report"


def points_of(rows):
    return efficiency.aggregate(efficiency.with_efficiency(rows))


class Tables(HTMLParser):
    """Every <table> of a page as a list of rows of cell texts, keyed by the preceding <h2>/<h3>."""

    def __init__(self):
        super().__init__()
        self.tables, self.heading, self._text, self._row, self._in = {}, "", "", None, None

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "h3", "td", "th"):
            self._text, self._in = "", tag
        elif tag == "tr":
            self._row = []
        elif tag == "br" and self._in:
            self._text += " "

    def handle_endtag(self, tag):
        if tag in ("h2", "h3"):
            self.heading = self._text.strip()
        elif tag in ("td", "th") and self._row is not None:
            self._row.append(" ".join(self._text.split()))
        elif tag == "tr" and self._row is not None:
            self.tables.setdefault(self.heading, []).append(self._row)
            self._row = None
        self._in = None if tag in ("td", "th", "h2", "h3") else self._in

    def handle_data(self, data):
        if self._in:
            self._text += data


def table(page: str, heading: str) -> list[dict]:
    parser = Tables()
    parser.feed(page)
    head, *body = parser.tables[heading]
    return [dict(zip(head, r, strict=True)) for r in body]


def percent(text: str) -> float | None:
    m = re.match(r"([\d.]+)%", text)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory.mktemp("breakdown"), sweep_rows())


@pytest.fixture(scope="module")
def page(built):
    return (built / "index.html").read_text()


def test_fixture_is_what_it_claims():
    """The sweep is built as meant: the ps is slower at every rank count and, against its own
    single rank, scales better than the ring somewhere, so the two efficiencies disagree."""
    points = {
        (p.config["model"], p.config["backend"], p.config.get("transport"), p.ranks): p
        for p in points_of(sweep_rows())
    }
    own_disagrees = False
    for model in ("vgg16", "resnet101"):
        for ranks in (1, 2, 4):
            ring, ps = points[(model, "ring", "tcp", ranks)], points[(model, "ps", "tcp", ranks)]
            assert ring.total > ps.total
            own_disagrees |= ring.own_efficiency < ps.own_efficiency
    assert own_disagrees
    assert points[("vgg16", "ring", "tcp", 4)].efficiency == pytest.approx(360 / 4 / 200)
    for p in points.values():
        if p.total is not None:
            assert sum(p.breakdown[c] for c in schema.PHASES) == pytest.approx(
                p.breakdown["step_time_ms_mean"], rel=1e-5
            )


def test_faster_ring_is_more_efficient_in_the_table(page):
    rows = table(page, "Results")
    eff_col = next(c for c in rows[0] if c.startswith("scaling efficiency"))
    own_col = "efficiency vs own smallest rank count"
    assert own_col in rows[0]
    by = {
        (r["model"].split()[0], r["backend"].split()[0], r.get("transport", ""), r["ranks"]): r for r in rows
    }
    checked = 0
    for (model, backend, transport, ranks), ring in by.items():
        ps = by.get((model, "ps", "tcp", ranks))
        if backend != "ring" or transport != "tcp" or ps is None or not ps["images/sec"]:
            continue
        if float(ring["images/sec"]) > float(ps["images/sec"]):
            assert percent(ring[eff_col]) > percent(ps[eff_col]), (model, ranks)
            checked += 1
    assert checked == 6
    # The field's figure: per-GPU images/sec over the baseline's, here 360 / 4 / 200.
    assert by[("vgg16", "ring", "tcp", "4")][eff_col] == "45.0%"
    assert by[("vgg16", "ring", "tcp", "4")][own_col] == "45.9% (vs 1)"
    assert "single-rank baseline" in by[("vgg16", "none", "", "1")]["backend"]


def test_faster_ring_is_more_efficient_in_the_paper_figure():
    fig = plots.comparison(points_of(sweep_rows()), "backend", ("ring", "ps"), "ring vs ps")
    checked = 0
    for ax in fig.axes:
        if not ax.get_visible() or not ax.containers:
            continue
        labels = {
            round(t.xy[0], 6): t.get_text()
            for t in ax.texts
            if hasattr(t, "xy") and t.get_text().endswith("%")
        }
        bars = {}
        for container in ax.containers:
            side = container.get_label().split()[0]
            for rect in container:
                x = rect.get_x() + rect.get_width() / 2
                slot = round(x)  # the rank count's tick
                bars.setdefault(slot, {})[side] = (rect.get_height(), percent(labels[round(x, 6)]))
        for sides in bars.values():
            if {"ring", "ps"} <= set(sides) and sides["ring"][0] > sides["ps"][0]:
                assert sides["ring"][1] > sides["ps"][1]
                checked += 1
        # The ideal: N × the single rank without distribution.
        ideal = [line for line in ax.get_lines() if line.get_label().startswith(plots.IDEAL_LABEL)]
        assert len(ideal) == 1
        base = {"VGG-16": 200.0, "ResNet-101": 300.0}[ax.get_title()]
        ticks = [int(t.get_text()) for t in ax.get_xticklabels()]
        assert list(ideal[0].get_ydata()) == pytest.approx([base * n for n in ticks])
    assert checked == 6


def test_baselines_are_the_reference_not_a_curve():
    points = points_of(sweep_rows())
    fig = plots.scaling(points)
    for ax in fig.axes:
        names = [line.get_label() for line in ax.get_lines()]
        assert not any(n.startswith("none") for n in names)
        assert any(n.startswith(plots.IDEAL_LABEL) for n in names)
    series = plots.efficiency_series(points)
    assert {kind for kind, _ in series.values()} == {"scaling"}
    assert not any(p.is_baseline for _, members in series.values() for p in members)


def test_breakdown_figure_beside_the_efficiency(built, page):
    for ext in ("png", "svg"):
        assert (built / "plots" / f"breakdown.{ext}").stat().st_size > 1000
    side = re.search(r"<div class='side'>(.*?)</div>", page, re.S)
    assert side is not None
    assert re.findall(r"src='plots/([\w-]+)\.png'", side.group(1)) == ["efficiency", "breakdown"]
    assert "Where the time went" in page


def test_breakdown_draws_hidden_communication_inside_backward():
    points = [p for p in points_of(sweep_rows()) if p.config["model"] == "vgg16"]
    fig = plots.breakdown(points)
    ax = next(a for a in fig.axes if a.get_title(loc="left") == "VGG-16")
    hatched = [r for r in ax.patches if r.get_hatch()]
    ring2 = next(p for p in points if p.config["backend"] == "ring" and p.ranks == 2)
    hidden = ring2.breakdown["hidden_comm_ms"]
    fwd, bwd = ring2.breakdown["forward_ms"], ring2.breakdown["backward_ms"]
    assert any(
        r.get_x() == pytest.approx(fwd + bwd - hidden) and r.get_width() == pytest.approx(hidden)
        for r in hatched
    )
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("1 rank, no distribution")
    assert "ring, 4 ranks" in labels


def test_sentences_name_the_dominant_cause(page):
    points = {
        (p.config["model"], p.config["backend"], p.config.get("transport"), p.ranks): p
        for p in points_of(sweep_rows())
    }
    assert report.dominant_cause(points[("vgg16", "ring", "tcp", 4)]) == "exposed allreduce"
    assert report.dominant_cause(points[("vgg16", "ring", "tcp", 2)]) == "compute"
    assert report.dominant_cause(points[("vgg16", "ps", "tcp", 4)]) == "parameter-server wait"
    assert report.dominant_cause(points[("resnet101", "ring", "tcp", 4)]) == "compute"
    assert report.dominant_cause(points[("inception3", "ring", "tcp", 2)]) == "negotiation"
    assert report.dominant_cause(points[("resnet101", "ps", "tcp", 8)]) is None  # failed
    # Step 711.1 ms of which 391.1 exposed; 2(4-1)/4 of 553.6 MB sent in 500 ms.
    assert (
        "VGG-16, 4 ranks, ring: 55% of the step is exposed allreduce (compute 45%); the ring moved "
        "0.83 GB/step per rank at 1.66 GB/s while communicating; scaling efficiency 45%." in page
    )
    assert (
        "VGG-16, 4 ranks, ps: 66% of the step is waiting on the parameter servers (compute 34%); each "
        "rank sent 0.55 GB/step to the parameter servers at 0.79 GB/s while communicating" in page
    )
    assert re.search(r"ResNet-101, 4 ranks, ring tcp: 90% of the step is compute", page)
    assert re.search(
        r"Inception V3, 2 ranks, ring \(replay\): \d+% of the step is exposed allreduce, "
        r"most of it negotiation",
        page,
    )
    assert "VGG-16, 1 rank without distribution (the baseline): 320.0 ms per step" in page


def test_definitions_near_the_top(page):
    top = page[: page.index("<h2>")]
    assert (
        "Scaling efficiency</b> = images/sec per GPU ÷ images/sec of one rank training without distribution"
        in top
    )
    assert "Efficiency vs own smallest rank count</b>" in top


def test_one_side_missing_still_draws(tmp_path):
    # Every ps run failed but one: the figure still draws the ring, and the ps where it ran.
    rows = sweep_rows()
    for r in rows:
        if r["backend"] == "ps" and r["ranks"] != "1":
            r.update(status="failed", error="boom", total_images_per_sec="")
            for c in schema.BREAKDOWN:
                r[c] = ""
    points = points_of(rows)
    fig = plots.comparison(points, "backend", ("ring", "ps"), "ring vs ps")
    assert fig is not None
    texts = [t.get_text().strip() for ax in fig.axes for t in ax.texts]
    assert "failed" in texts and "not run" in texts  # ps failed at 2 and 4; the ring has no 8
    # Without any baseline the figure still draws, without the ideal line and the % labels.
    nobase = [r for r in rows if r["backend"] != "none"]
    fig = plots.comparison(points_of(nobase), "backend", ("ring", "ps"), "ring vs ps")
    assert fig is not None
    assert not any(
        line.get_label().startswith(plots.IDEAL_LABEL) for ax in fig.axes for line in ax.get_lines()
    )
    report_dir = build(tmp_path, rows)
    assert (report_dir / "plots" / "ring-vs-ps.png").exists()


def test_old_csv_without_breakdown_renders(tmp_path):
    report_dir = build(tmp_path, old_rows())
    page = (report_dir / "index.html").read_text()
    stems = sorted(p.stem for p in (report_dir / "plots").glob("*.png"))
    assert "breakdown" not in stems
    assert {"scaling", "efficiency", "ring-vs-ps", "tcp-vs-rdma"} <= set(stems)
    assert "holds no time breakdown" in page
    assert "No single-rank run without distribution" in page
    rows = table(page, "Results")
    vgg_ring4 = next(
        r for r in rows if r["model"] == "vgg16" and r["backend"] == "ring" and r["ranks"] == "4"
    )
    assert vgg_ring4["efficiency vs own smallest rank count"] == "45.9% (vs 1)"
    assert percent(next(v for k, v in vgg_ring4.items() if k.startswith("scaling efficiency")) or "") is None
    # The efficiency plot falls back to the configuration's own start, and says so.
    points = points_of(old_rows())
    assert {kind for kind, _ in plots.efficiency_series(points).values()} == {"own"}
    assert (
        "Efficiency vs own smallest rank count"
        in dict((s, c) for s, c, _ in plots.all_figures(points))["efficiency"]
    )
