"""kolo-sim through the sweep runner ([launcher] kind = "sim"), scripts/sim-validate's arithmetic
(reports/simvalidate.py), and the regression gate on predicted rows."""

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest
from reports import gate, schema, simvalidate

from conftest import ROOT, run_cli

BIN_DIR = Path(os.environ.get("KOLO_BIN_DIR") or ROOT / "build" / "bin")

SIM_SWEEP = """
[sweep]
name = "sim-test"

[launcher]
kind = "sim"

[fixed]
compute = "replay"
profile = "models/profiles/{model}-h100-b64.json"
batch_size = 64
backend = "ring"
transport = "tcp"
link = "1gbit"
dilation = 25
calibration = "sim/calibrations/emulated-tbf.json"

[matrix]
model = ["resnet101"]
ranks = [2, 4]
fusion_threshold_mb = [0, 64]
"""


def need_sim():
    if not (BIN_DIR / "kolo-sim").exists():
        pytest.skip(f"{BIN_DIR}/kolo-sim not built (cmake --build build --target kolo-sim)")


@pytest.fixture(scope="module")
def sim_rows(tmp_path_factory):
    need_sim()
    tmp = tmp_path_factory.mktemp("sim")
    sweep = tmp / "sweep.toml"
    sweep.write_text(SIM_SWEEP)
    out = tmp / "out"
    result = run_cli(
        "sweep", str(sweep), "--out", str(out), "--bin-dir", str(BIN_DIR), "--no-report", timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out / "results.csv", schema.read_rows(str(out / "results.csv"))


def test_a_sim_sweep_writes_simulated_rows(sim_rows):
    _, rows = sim_rows
    # 2 ranks x 2 thresholds, and the single-rank baseline the runner adds.
    assert len(rows) == 5
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert r["compute"] == "simulated"
        assert r["network"] == "simulated"
        assert float(r["total_images_per_sec"]) > 0
    base = next(r for r in rows if r["backend"] == "none")
    for r in rows:
        if r["backend"] == "none":
            continue
        eff = float(r["scaling_efficiency"])
        assert 0 < eff <= 1.0 + 1e-9
        # The prediction is per rank no faster than the single rank.
        per_rank = float(r["total_images_per_sec"]) / int(r["ranks"])
        assert per_rank <= float(base["total_images_per_sec"]) * (1 + 1e-9)
    # Tensor Fusion on is never slower than off at the same rank count.
    for n in ("2", "4"):
        on = next(r for r in rows if r["ranks"] == n and r["fusion_threshold_mb"] == "64")
        off = next(r for r in rows if r["ranks"] == n and r["fusion_threshold_mb"] == "0")
        assert float(on["total_images_per_sec"]) >= float(off["total_images_per_sec"])
        assert float(on["collectives_per_step"]) < float(off["collectives_per_step"])


def test_step_jitter_is_a_sweep_setting_of_predictions(tmp_path):
    """step_jitter reaches kolo-sim, lands in its column, slows the multi-rank points and leaves
    the one single-rank baseline alone (every rank count shares it)."""
    need_sim()
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        SIM_SWEEP.replace("fusion_threshold_mb = [0, 64]", "step_jitter = [0, 0.05]")
        .replace("ranks = [2, 4]", "ranks = [4]")
        # A P100's pace: compute, not the network, sets the step.
        .replace("batch_size = 64", "batch_size = 64\ngpu_rate = 100.0")
    )
    out = tmp_path / "out"
    result = run_cli(
        "sweep", str(sweep), "--out", str(out), "--bin-dir", str(BIN_DIR), "--no-report", timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = schema.read_rows(str(out / "results.csv"))
    assert sorted(r["backend"] for r in rows) == ["none", "ring", "ring"], rows
    ring = {r["step_jitter"]: float(r["total_images_per_sec"]) for r in rows if r["backend"] == "ring"}
    assert set(ring) == {"0", "0.05"}
    # The slowest of 4 ranks lies 1.03 standard deviations above the mean: 5.1% slower.
    assert 1.045 < ring["0"] / ring["0.05"] < 1.06
    # A measured row cannot carry it: it is a setting of predictions only.
    measured = tmp_path / "measured.toml"
    measured.write_text(SIM_SWEEP.replace('kind = "sim"', 'kind = "local"') + "step_jitter = [0.05]\n")
    refused = run_cli("sweep", str(measured), "--out", str(tmp_path / "m"), "--dry-run")
    assert refused.returncode != 0
    assert "step_jitter = 0.05 is a setting of predictions" in refused.stdout + refused.stderr


def test_an_autotuned_prediction_says_which_allreduce_it_chose(tmp_path):
    """kolo-sim predict --autotune with hierarchical allreduce among the knobs: the row's
    allreduce column is the layout the search chose (as in the record's autotune.choice)."""
    need_sim()
    sweep = tmp_path / "sweep.toml"
    sweep.write_text((ROOT / "sweeps" / "autotune-hier-emulated-predicted.toml").read_text())
    out = tmp_path / "out"
    result = run_cli(
        "sweep", str(sweep), "--out", str(out), "--bin-dir", str(BIN_DIR), "--no-report", timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [r for r in schema.read_rows(str(out / "results.csv")) if r["backend"] == "ring"]
    assert len(rows) == 1, rows
    records = [json.loads(p.read_text()) for p in out.rglob("*.json")]
    chosen = [r["autotune"]["choice"] for r in records if "autotune" in r]
    assert len(chosen) == 1, records
    want = "hierarchical" if chosen[0]["hierarchical_allreduce"] else "flat"
    assert rows[0]["allreduce"] == want, rows[0]
    assert rows[0]["autotune"] == "on"


def test_the_gate_judges_simulated_rows(sim_rows, tmp_path):
    path, rows = sim_rows
    eff = {
        (r["ranks"], r["fusion_threshold_mb"]): float(r["scaling_efficiency"])
        for r in rows
        if r["backend"] == "ring"
    }
    recorded = eff[("4", "64")]

    def baseline(min_eff: float) -> str:
        text = tmp_path / f"b{min_eff}.toml"
        text.write_text(
            '[defaults]\nmax_drop = 0.05\n\n[[check]]\nmodel = "resnet101"\nranks = 4\n'
            f'fusion_threshold_mb = 64\nbackend = "ring"\nefficiency = {recorded}\n'
            f"min_efficiency = {min_eff}\n"
        )
        return str(text)

    ok = run_cli("check-regression", str(path), "--baseline", baseline(0.1))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # A floor above the prediction fails.
    short = run_cli("check-regression", str(path), "--baseline", baseline(min(1.0, recorded + 0.02)))
    assert short.returncode == 1, short.stdout + short.stderr
    # And through the gate's own functions: halving the predicted rate falls short of the record.
    halved = [
        dict(r, total_images_per_sec=str(float(r["total_images_per_sec"]) / 2))
        if r["backend"] != "none"
        else r
        for r in rows
    ]
    for r in halved:
        r["scaling_efficiency"] = ""
    checks = gate.load(baseline(0.1)).checks
    assert all(v.ok for v in gate.evaluate(rows, checks))
    assert not any(v.ok for v in gate.evaluate(halved, checks))


def _write(path: Path, rows: list[dict]) -> str:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=schema.COLUMNS)
        w.writeheader()
        for r in rows:
            full = {k: "" for k in schema.COLUMNS}
            full.update(r)
            w.writerow(full)
    return str(path)


def _row(point: str, ranks: int, fusion: str, rate: float, status: str = "ok") -> dict:
    return dict(
        point_id=point,
        run_id="r",
        model="vgg16",
        ranks=str(ranks),
        backend="ring",
        transport="tcp",
        fusion_threshold_mb=fusion,
        total_images_per_sec=str(rate),
        status=status,
    )


def test_sim_validate_error_arithmetic(tmp_path):
    measured = _write(
        tmp_path / "m.csv",
        [
            _row("a", 2, "0", 100.0),
            _row("b", 2, "64", 200.0),
            _row("c", 4, "64", 400.0),
            _row("d", 8, "64", 800.0, status="failed"),
        ],
    )
    predicted = _write(
        tmp_path / "p.csv",
        [
            _row("a", 2, "0", 110.0),  # +10%
            _row("b", 2, "64", 190.0),  # -5%
            _row("c", 4, "64", 404.0),  # +1%
            _row("d", 8, "64", 700.0),  # measured failed: not compared
            _row("e", 16, "64", 1.0),  # no measured twin
        ],
    )
    pairs = simvalidate.compare(schema.read_rows(predicted), schema.read_rows(measured))
    errors = sorted(round(p["error"], 6) for p in pairs)
    assert errors == [-0.05, 0.01, 0.1]
    # Fusion on and off at the same ranks are told apart.
    assert {p["fusion_threshold_mb"] for p in pairs if p["ranks"] == "2"} == {"0", "64"}
    text = simvalidate.table(pairs)
    assert "3 points: median absolute error 5.0%, worst 10.0%" in text
    md = tmp_path / "t.md"
    assert simvalidate.main([predicted, measured, "--markdown", str(md)]) == 0
    assert md.read_text() == text
    # Nothing to compare: exit 1 with the reason.
    other = _write(tmp_path / "o.csv", [_row("z", 3, "64", 5.0)])
    assert simvalidate.main([other, measured]) == 1


def test_sim_validate_takes_the_median_of_repeats_and_states_their_spread(tmp_path):
    # Three repeats of one configuration (distinct point ids, as a sweep's repeats have): the
    # prediction is compared with their median, and their spread is (max - min) / median.
    measured = _write(
        tmp_path / "m.csv",
        [
            _row("a0", 2, "64", 90.0),
            _row("a1", 2, "64", 100.0),
            _row("a2", 2, "64", 120.0),
            _row("b0", 4, "64", 200.0),
        ],
    )
    predicted = _write(tmp_path / "p.csv", [_row("pa", 2, "64", 115.0), _row("pb", 4, "64", 230.0)])
    pairs = {
        p["ranks"]: p for p in simvalidate.compare(schema.read_rows(predicted), schema.read_rows(measured))
    }
    assert pairs["2"]["measured"] == 100.0 and pairs["2"]["repeats"] == 3
    assert abs(pairs["2"]["spread"] - 0.30) < 1e-9
    assert abs(pairs["2"]["error"] - 0.15) < 1e-9
    assert pairs["4"]["repeats"] == 1 and pairs["4"]["spread"] == 0
    text = simvalidate.table(list(pairs.values()))
    assert "| vgg16 | 2 | ring | 64 | 100.0 | 3 | 30.0% | 115.0 | +15.0% |" in text
    assert "| vgg16 | 4 | ring | 64 | 200.0 | 1 | - | 230.0 | +15.0% |" in text
    # +15% against a 30% spread: inside it; the single run has no spread to be inside.
    assert "1 of 1 repeated points predicted within their spread" in text


@pytest.mark.parametrize(
    "example,median,worst",
    [
        ("sim-fig6-emulated", 3.3, 11.2),
        ("sim-validate-emulated", 4.5, 8.1),
        ("sim-validate-loopback", 3.1, 12.2),
        ("ps-pacing-emulated", 3.5, 11.5),
    ],
)
def test_the_committed_validations_say_what_their_readmes_say(example, median, worst):
    # Each committed validation's predicted and measured rows give the errors its README (and the
    # docs) quote.
    d = ROOT / "reports" / "examples" / example
    predicted = d / ("results.csv" if example == "sim-fig6-emulated" else "predicted.csv")
    measured = d / ("measured.csv" if example == "sim-fig6-emulated" else "results.csv")
    text = simvalidate.table(
        simvalidate.compare(schema.read_rows(str(predicted)), schema.read_rows(str(measured)))
    )
    assert f"median absolute error {median:.1f}%, worst {worst:.1f}%" in text
    readme = " ".join((d / "README.md").read_text().split())
    assert f"median {median:.1f}%, worst {worst:.1f}%" in readme
    # The docs quote them too (docs/kolo-sim.md and docs/measured.md).
    docs = " ".join(" ".join(p.read_text().split()) for p in sorted((ROOT / "docs").glob("*.md")))
    assert f"{example}/" in docs and f"median {median:.1f}%, worst {worst:.1f}%" in docs


def _recalibrate(argv, committed_name):
    """Runs `argv` (kolo-sim calibrate ... --out FILE) in sim/calibrations and checks that it
    writes the committed calibration `committed_name` (but for its source, which names the output
    file); returns the run and what it wrote."""
    cal_dir = ROOT / "sim" / "calibrations"
    done = subprocess.run(argv, cwd=cal_dir, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(Path(argv[argv.index("--out") + 1]).read_text())
    committed = json.loads((cal_dir / committed_name).read_text())
    got["source"] = committed["source"] = ""
    assert got == committed
    return done, got


def test_the_committed_loopback_calibration_is_what_its_bench_files_give(tmp_path):
    # kolo-sim calibrate over the committed loopback bench files (the command in reports/examples/
    # sim-validate-loopback/README.md) writes the committed calibration, size regimes included.
    need_sim()
    cal_dir = ROOT / "sim" / "calibrations"
    bench = sorted(str(p.relative_to(cal_dir)) for p in (cal_dir / "bench").glob("loopback-np*-run*.json"))
    bench += sorted(str(p.relative_to(cal_dir)) for p in (cal_dir / "bench").glob("steps-loopback-*.json"))
    assert len(bench) == 8, bench
    out = tmp_path / "cal.json"
    argv = [str(BIN_DIR / "kolo-sim"), "calibrate", "--link", "1gbit", "--name", "loopback-tcp"]
    argv += ["--base", "loopback-tcp.json", "--out", str(out), *bench]
    done, got = _recalibrate(argv, "loopback-tcp.json")
    assert got["intra_large_bytes"] == 16 << 20
    assert "buffers of 16777216 bytes and more: bandwidth 2.623 GB/s (size regimes)" in done.stdout
    # Asked for one bandwidth, the fit has none for large buffers.
    one = subprocess.run(
        [*argv[:2], "--no-size-regimes", *argv[2:]], cwd=cal_dir, capture_output=True, text=True, timeout=120
    )
    assert one.returncode == 0, one.stderr
    assert "intra_large_bytes" not in json.loads(out.read_text())
    assert "size regimes" not in one.stdout


def test_the_committed_emulated_calibration_is_what_its_bench_files_give(tmp_path):
    # kolo-sim calibrate over the committed bench files (the command in reports/examples/
    # sim-fig6-emulated/README.md) writes the committed calibration, paced incast included: a paced
    # run's spread counts as a share of the unpaced one at its worker count.
    need_sim()
    cal_dir = ROOT / "sim" / "calibrations"
    incast = [f"bench/incast-{n}workers.json" for n in (2, 4, 8)] + ["bench/incast-8workers-paced-2x.json"]
    bench = [f"bench/emulated-{n}x1gbit.json" for n in (2, 4, 8)]
    bench += [f"bench/steps-emulated-{n}x1gbit-resnet101.json" for n in (2, 4, 8)]
    out = tmp_path / "cal.json"
    argv = [str(BIN_DIR / "kolo-sim"), "calibrate", "--link", "1gbit", "--burst", "262144"]
    argv += ["--base", "emulated-tbf.json", "--name", "emulated-tbf-bench", "--incast", *incast]
    argv += ["--out", str(out), *bench]
    done, got = _recalibrate(argv, "emulated-tbf-bench.json")
    paced = json.loads((cal_dir / "bench/incast-8workers-paced-2x.json").read_text())
    unpaced = json.loads((cal_dir / "bench/incast-8workers.json").read_text())
    share = paced["ps_stream_spread"] / unpaced["ps_stream_spread"]
    assert got["ps_paced_spread_share"] == {"2": pytest.approx(share)}
    assert "8 paced at 2 times a fair share" in done.stdout
    # A paced run with no unpaced one of its worker count to compare with: exit 2, naming it.
    argv_bad = argv[: argv.index("--incast") + 1] + ["bench/incast-8workers-paced-2x.json"]
    argv_bad += ["--out", str(tmp_path / "bad.json"), *bench]
    bad = subprocess.run(argv_bad, cwd=cal_dir, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "bench/incast-8workers-paced-2x.json: paced at 3.125e+07 B/s with 8 workers" in bad.stderr


def test_calibrate_takes_step_jitter_from_one_rank_run_records(tmp_path):
    # kolo-sim calibrate --jitter: the median of the records' spreads, kept in the calibration;
    # a record of two ranks is refused by name.
    need_sim()
    cal_dir = ROOT / "sim" / "calibrations"
    records = []
    runs = [(200.0, 2.0, 1), (200.0, 6.0, 1), (100.0, 4.0, 1), (100.0, 1.0, 2)]
    for i, (rate, stddev, ranks) in enumerate(runs):
        path = tmp_path / f"run{i}.json"
        results = {"images_per_sec_per_rank": rate, "images_per_sec_stddev": stddev}
        path.write_text(json.dumps({"settings": {"ranks": ranks}, "status": "ok", "results": results}))
        records.append(str(path))
    out = tmp_path / "cal.json"
    argv = [str(BIN_DIR / "kolo-sim"), "calibrate", "--link", "1gbit", "--base", "loopback-tcp.json"]
    argv += ["--out", str(out), "bench/loopback-np2-run1.json"]
    ok = subprocess.run(
        [*argv, *[a for r in records[:3] for a in ("--jitter", r)]],
        cwd=cal_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(out.read_text())["step_jitter"] == pytest.approx(0.03)  # 1%, 3%, 4%
    assert "step_jitter 0.0300" in ok.stdout
    two = subprocess.run(
        [*argv, "--jitter", records[3]], cwd=cal_dir, capture_output=True, text=True, timeout=120
    )
    assert two.returncode == 2
    assert "a run of 2 ranks; allowed: 1" in two.stderr


def test_predictions_are_drawn_beside_their_measurements(tmp_path):
    # scripts/report DIR --predicted CSV: the figure of predictions beside measurements and the
    # table of each point's error, from the committed loopback validation; each line of the figure
    # holds the values it stands for.
    d = ROOT / "reports" / "examples" / "sim-validate-loopback"
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "results.csv").write_text((d / "results.csv").read_text())
    pairs = simvalidate.compare(
        schema.read_rows(str(d / "predicted.csv")), schema.read_rows(str(out / "results.csv"))
    )
    fig = simvalidate.figure(pairs)
    legend = {t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()}
    i3 = [p for p in pairs if p["model"] == "inception3" and p["fusion_threshold_mb"] == "0"]
    i3 = sorted((p for p in i3 if p["backend"] == "ring"), key=lambda p: int(p["ranks"]))
    predicted = fig.axes[0].get_lines()
    drawn = next(line for line in predicted if line.get_label() == "fusion 0 MiB predicted")
    assert list(drawn.get_ydata()) == pytest.approx([p["predicted"] for p in i3])
    assert {"fusion 64 MiB measured", "fusion 0 MiB predicted", "1 rank: predicted"} <= legend
    assert "compute = replay" in fig.get_supxlabel()
    result = run_cli("report", str(out), "--predicted", str(d / "predicted.csv"))
    assert result.returncode == 0, result.stderr
    assert (out / "report" / "plots" / "predicted.png").exists()
    page = (out / "report" / "index.html").read_text()
    assert "<h2>Predicted against measured</h2>" in page
    assert "15 points: median absolute error 3.1%, worst 12.2%" in page
    assert "<td>+12.2%</td>" in page
    # A missing predicted file is named; predictions of other points say that nothing matched.
    missing = run_cli("report", str(out), "--predicted", str(tmp_path / "nope.csv"))
    assert missing.returncode == 2 and "nope.csv does not exist" in missing.stderr
    other = _write(tmp_path / "o.csv", [_row("z", 3, "64", 5.0)])
    unmatched = run_cli("report", str(out), "--predicted", other)
    assert unmatched.returncode == 0, unmatched.stderr
    assert "No predicted row has a measured twin" in (out / "report" / "index.html").read_text()
    assert not (out / "report" / "plots" / "predicted.png").exists()


def test_sim_validate_draws_its_figure(tmp_path):
    measured = _write(tmp_path / "m.csv", [_row("a", 2, "64", 100.0), _row("b", 4, "64", 180.0)])
    predicted = _write(tmp_path / "p.csv", [_row("pa", 2, "64", 105.0), _row("pb", 4, "64", 170.0)])
    png = tmp_path / "v.png"
    assert simvalidate.main([predicted, measured, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
