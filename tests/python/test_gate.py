"""The regression gate: pass, each way to fall short, and bad baselines."""

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
    assert "all 2 check(s) passed" in result.stdout


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
    # Halve every distributed throughput of a CSV that meets the CI baseline: the gate must fail.
    baseline = ROOT / "reports" / "baselines" / "ci.toml"
    checks = gate.load_baseline(str(baseline))
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
        )
        rows.append(row)
    healthy = tmp_path / "healthy.csv"
    schema.write_rows(str(healthy), rows)
    result = run_cli("check-regression", str(healthy), "--baseline", str(baseline))
    assert result.returncode == 0, result.stdout
    for r in rows:
        if r["backend"] != "none":
            r["total_images_per_sec"] = str(float(r["total_images_per_sec"]) / 2)
    regressed = tmp_path / "regressed.csv"
    schema.write_rows(str(regressed), rows)
    result = run_cli("check-regression", str(regressed), "--baseline", str(baseline))
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
