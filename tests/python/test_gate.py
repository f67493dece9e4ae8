"""The regression gate: pass, each way to fall short, and bad baselines."""

import json
import shutil

import pytest
from reports import gate, schema

from conftest import FIXTURES, ROOT, run_cli

CSV = str(FIXTURES / "results.csv")
PASSING = """
[defaults]
min_efficiency = 0.5
max_drop = 0.05

[[check]]
model = "resnet101"
ranks = 8
backend = "ring"
transport = "tcp"
fusion_threshold_mb = 64
efficiency = 0.87

[[check]]
model = "inception3"
ranks = 4
backend = "ring"
transport = "tcp"
efficiency = 0.93
"""


def write(tmp_path, text):
    path = tmp_path / "baseline.toml"
    path.write_text(text)
    return str(path)


def test_pass(tmp_path):
    result = run_cli("check-regression", CSV, "--baseline", write(tmp_path, PASSING))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 2 judged check(s) passed" in result.stdout


def test_fail_below_minimum(tmp_path):
    text = PASSING.replace("efficiency = 0.87", "efficiency = 0.87\nmin_efficiency = 0.9")
    result = run_cli("check-regression", CSV, "--baseline", write(tmp_path, text))
    assert result.returncode == 1
    assert "FAIL: below the minimum 0.90" in result.stdout
    assert "1 of 2 check(s) fell short" in result.stdout


def test_fail_drop_from_recorded(tmp_path):
    text = PASSING.replace("efficiency = 0.87", "efficiency = 0.95")
    result = run_cli("check-regression", CSV, "--baseline", write(tmp_path, text))
    assert result.returncode == 1
    assert "dropped 0.100 from 0.95 (allowed 0.05)" in result.stdout
    assert "0.850" in result.stdout


def test_failed_point_and_missing_rows_fall_short():
    checks = gate.parse_baseline(
        {
            "check": [
                {"model": "vgg16", "ranks": 8, "backend": "ps", "efficiency": 0.5},
                {"model": "vgg16", "ranks": 64, "efficiency": 0.5},
            ]
        },
        "b",
    )
    verdicts = gate.evaluate(schema.read_rows(CSV), checks)
    assert [v.ok for v in verdicts] == [False, False]
    assert verdicts[0].reason.startswith("point failed: timed out")
    assert verdicts[1].reason == "no row of the CSV matches"


def test_each_matched_configuration_is_judged():
    # resnet101 at 4 ranks on ring/tcp has six fusion thresholds: six verdicts, 0 MiB (0.55) fails.
    checks = gate.parse_baseline(
        {
            "defaults": {"min_efficiency": 0.6},
            "check": [
                {"model": "resnet101", "ranks": 4, "backend": "ring", "transport": "tcp", "efficiency": 0.9}
            ],
        },
        "b",
    )
    verdicts = gate.evaluate(schema.read_rows(CSV), checks)
    assert len(verdicts) == 6
    assert [v.config for v in verdicts if not v.ok] == ["fusion_threshold_mb=0"]


def test_regressed_run_fails_against_the_shipped_baseline(tmp_path):
    # A CSV and a bench run that meet the CI baseline pass; halve every distributed throughput,
    # and the gate must fail.
    baseline = ROOT / "reports" / "baselines" / "ci.toml"
    shipped = gate.load(str(baseline))
    checks = shipped.checks
    rows = []
    for model in sorted({c.where["model"] for c in checks}):
        row = {k: "" for k in schema.COLUMNS}
        row.update(model=model, ranks="1", backend="none", status="ok", point_id=f"{model}-none")
        row.update(total_images_per_sec="100")
        rows.append(row)
    for c in checks:
        ranks = int(c.where["ranks"])
        row = {k: "" for k in schema.COLUMNS}
        row.update(
            {k: str(v) for k, v in c.where.items()},
            status="ok",
            point_id=c.name(),
            total_images_per_sec=str(100 * ranks * c.recorded),
            collectives_per_step=str(c.collectives_per_step or ""),
            cycle_hold_ms=str(c.cycle_hold_ms or ""),
            host_other_cores="0",
        )
        rows.append(row)
    bench_rows = []
    for ring in shipped.rings:
        for backend, cpu in (("ring", 1000.0), (ring.reference, 1000.0 * ring.cpu_ratio)):
            bench_rows.append(
                {
                    "backend": backend,
                    "bytes": ring.bytes,
                    "wrong": 0,
                    "time": {"iters_us": [1000.0] * 5},
                    "cpu_iters_us": [cpu] * 5,
                }
            )
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"ranks": shipped.rings[0].ranks, "rows": bench_rows}))
    healthy = tmp_path / "healthy.csv"
    schema.write_rows(str(healthy), rows)
    result = run_cli("check-regression", str(healthy), "--baseline", str(baseline), "--bench", str(bench))
    assert result.returncode == 0, result.stdout
    for r in rows:
        if r["backend"] != "none":
            r["total_images_per_sec"] = str(float(r["total_images_per_sec"]) / 2)
    regressed = tmp_path / "regressed.csv"
    schema.write_rows(str(regressed), rows)
    result = run_cli("check-regression", str(regressed), "--baseline", str(baseline), "--bench", str(bench))
    assert result.returncode == 1
    assert "fell short" in result.stdout


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[[check]]\nmodel='vgg16'\nranks=2\n", "'efficiency' is missing"),
        ("[[check]]\nmodel='vgg16'\nranks=0\nefficiency=0.9\n", "ranks = 0 is not allowed"),
        ("[[check]]\nmodel='vgg16'\nranks=2\nefficiency=0.9\nmax_dorp=0.1\n", "unknown key 'max_dorp'"),
        ("[[check]]\nmodel='vgg16'\nranks=2\nefficiency='high'\n", "efficiency = 'high' is not allowed"),
        (
            "[defaults]\nmin_eff=0.5\n[[check]]\nmodel='vgg16'\nranks=2\nefficiency=0.9\n",
            "unknown key [defaults] min_eff",
        ),
        ("[defaults]\nmin_efficiency=0.5\n", "no [[check]] table"),
        ("[gate]\n", "unknown key 'gate'"),
        ("[[check]\n", "not valid TOML"),
    ],
)
def test_bad_baseline_exits_2(tmp_path, text, fragment):
    result = run_cli("check-regression", CSV, "--baseline", write(tmp_path, text))
    assert result.returncode == 2
    assert fragment in result.stderr


def test_bad_csv_exits_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n")
    result = run_cli("check-regression", str(bad), "--baseline", write(tmp_path, PASSING))
    assert result.returncode == 2 and "header" in result.stderr
    shutil.copy(CSV, tmp_path / "ok.csv")


def test_written_baseline_names_each_configuration_and_passes(tmp_path):
    baseline = tmp_path / "recorded.toml"
    result = run_cli("check-regression", CSV, "--write-baseline", str(baseline), "--min-efficiency", "0.3")
    assert result.returncode == 0, result.stderr
    checks = gate.load_baseline(str(baseline))
    # 3 models x 4 rank counts x (ring tcp, ring rdma, ps), less the failed vgg16 ps point, plus
    # resnet101's five other fusion thresholds at 1 and 4 ranks; the baselines (1.0) left out.
    assert len(checks) == 3 * 4 * 3 - 1 + 5 * 2
    assert not [c for c in checks if c.where.get("backend") == "none"]
    assert all("profile" not in c.where for c in checks)
    check = run_cli("check-regression", CSV, "--baseline", str(baseline))
    assert check.returncode == 0, check.stdout


def _point(model, ranks, backend="ring", **results):
    row = {k: "" for k in schema.COLUMNS}
    row.update(
        model=model, ranks=str(ranks), backend=backend, status="ok", point_id=f"{model}-{backend}-{ranks}"
    )
    row.update({k: str(v) for k, v in results.items()})
    return row


def _counter_csv(tmp_path, other_cores, efficiency, collectives=50.0, hold=0.5):
    rows = [
        _point("resnet101", 1, "none", total_images_per_sec=100),
        _point(
            "resnet101",
            4,
            total_images_per_sec=400 * efficiency,
            host_other_cores=other_cores,
            collectives_per_step=collectives,
            cycle_hold_ms=hold,
        ),
    ]
    path = tmp_path / f"r{other_cores}-{efficiency}-{collectives}-{hold}.csv"
    schema.write_rows(str(path), rows)
    return str(path)


COUNTERS = """
[defaults]
max_drop = 0.2
max_other_cores = 0.25
counter_factor = 3

[[check]]
model = "resnet101"
ranks = 4
efficiency = 0.7
collectives_per_step = 50
cycle_hold_ms = 0.5
"""


def test_efficiency_is_not_judged_on_a_busy_host_but_counters_are(tmp_path):
    baseline = write(tmp_path, COUNTERS)
    quiet_bad = run_cli("check-regression", _counter_csv(tmp_path, 0.05, 0.3), "--baseline", baseline)
    assert quiet_bad.returncode == 1 and "dropped 0.400 from 0.70" in quiet_bad.stdout
    busy_bad = run_cli("check-regression", _counter_csv(tmp_path, 1.9, 0.3), "--baseline", baseline)
    assert busy_bad.returncode == 0, busy_bad.stdout
    assert "not judged: other work used 1.90 cores" in busy_bad.stdout
    assert "1 time-based check(s) not judged" in busy_bad.stdout
    # Busy or not, the counters judge: fusion off (7x the collectives) and a longer cycle (a hold
    # of 8 ms per exchange against 0.5).
    fusion_off = run_cli(
        "check-regression", _counter_csv(tmp_path, 1.9, 0.3, collectives=350), "--baseline", baseline
    )
    assert fusion_off.returncode == 1
    assert "more than 3 x the recorded 50.0" in fusion_off.stdout
    slow_cycle = run_cli("check-regression", _counter_csv(tmp_path, 1.9, 0.3, hold=8), "--baseline", baseline)
    assert slow_cycle.returncode == 1
    assert "8.00 ms per exchange, more than 2.00" in slow_cycle.stdout
    within = run_cli(
        "check-regression",
        _counter_csv(tmp_path, 0.0, 0.7, collectives=140, hold=1.9),
        "--baseline",
        baseline,
    )
    assert within.returncode == 0, within.stdout


def test_a_counter_the_csv_lacks_falls_short(tmp_path):
    path = _counter_csv(tmp_path, 0.0, 0.7, collectives="", hold="")
    result = run_cli("check-regression", path, "--baseline", write(tmp_path, COUNTERS))
    assert result.returncode == 1
    assert "the CSV has no collectives_per_step" in result.stdout


RING = (
    COUNTERS
    + """
[[ring]]
ranks = 4
bytes = 4194304
reference = "link"
cpu_ratio = 0.9
max_drop = 0.06
"""
)


def _bench(tmp_path, ring_cpu, link_cpu=9000.0, wrong=0, name="bench.json"):
    def row(backend, cpu, wrong=0):
        return {
            "backend": backend,
            "bytes": 4194304,
            "wrong": wrong,
            "time": {"iters_us": [10000.0 + i for i in range(9)]},
            "cpu_iters_us": [cpu * (1 + 0.01 * (i % 3)) for i in range(9)],
        }

    path = tmp_path / name
    path.write_text(json.dumps({"ranks": 4, "rows": [row("ring", ring_cpu, wrong), row("link", link_cpu)]}))
    return str(path)


def test_the_ring_check_judges_cpu_per_iteration_against_the_reference(tmp_path):
    baseline = write(tmp_path, RING)
    csv = _counter_csv(tmp_path, 0.0, 0.7)
    ok = run_cli("check-regression", csv, "--baseline", baseline, "--bench", _bench(tmp_path, 10000.0))
    assert ok.returncode == 0, ok.stdout
    # 10% more CPU per iteration in kolo's ring: the ratio falls from 0.9 to about 0.82.
    slower = run_cli("check-regression", csv, "--baseline", baseline, "--bench", _bench(tmp_path, 11000.0))
    assert slower.returncode == 1
    assert "costs more CPU per iteration against link" in slower.stdout
    missing = run_cli("check-regression", csv, "--baseline", baseline)
    assert missing.returncode == 1 and "no bench JSON at 4 ranks" in missing.stdout
    wrong = run_cli(
        "check-regression", csv, "--baseline", baseline, "--bench", _bench(tmp_path, 10000.0, wrong=3)
    )
    assert wrong.returncode == 1 and "3 wrong element(s)" in wrong.stdout
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    bad = run_cli("check-regression", csv, "--baseline", baseline, "--bench", str(garbage))
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[[ring]]\nranks=4\nbytes=4\n", "'cpu_ratio' is missing"),
        ("[[ring]]\nranks=1\nbytes=4\ncpu_ratio=0.9\n", "ranks = 1 is not allowed"),
        (
            "[[ring]]\nranks=4\nbytes=4\ncpu_ratio=0.9\nreference='ring'\n",
            "reference = 'ring' is not allowed",
        ),
        ("[[ring]]\nranks=4\nbytes=4\ncpu_ratio=0.9\nspeed=2\n", "unknown key 'speed'"),
        ("[defaults]\ncounter_factor=0.5\n", "counter_factor = 0.5 is not allowed"),
    ],
)
def test_bad_ring_and_counter_settings_exit_2(tmp_path, text, fragment):
    text = "[[check]]\nmodel='vgg16'\nranks=2\nefficiency=0.9\n" + text
    result = run_cli("check-regression", CSV, "--baseline", write(tmp_path, text))
    assert result.returncode == 2
    assert fragment in result.stderr, result.stderr
