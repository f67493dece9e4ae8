"""End-to-end sweeps of the real kolo-train: two oneDNN points through mpirun, then the report and
the gate on what they measured; and two replay points through kolo-run, which every build can run
(no MPI, oneDNN or CUDA). Skipped, saying why, when kolo-train or a part a test needs is not
built."""

import os
from pathlib import Path

import pytest
from reports import schema

from conftest import ROOT, need_build, need_mpirun, run_cli

BIN_DIR = Path(os.environ.get("KOLO_BIN_DIR", ROOT / "build" / "bin"))


def need_train():
    train = BIN_DIR / "kolo-train"
    if not os.access(train, os.X_OK):
        pytest.skip(f"{train} is not built (scripts/build, or set KOLO_BIN_DIR)")


def run_two_points(write_sweep, tmp_path, text):
    """Runs the sweep `text` (ranks 1 and 2) with the real binaries and returns its folder and
    rows, once it exited 0 with both points ok."""
    out = tmp_path / "out"
    result = run_cli("sweep", write_sweep(text), "--out", str(out), "--bin-dir", str(BIN_DIR))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = schema.read_rows(str(out / "results.csv"))
    assert [(r["ranks"], r["status"]) for r in rows] == [("1", "ok"), ("2", "ok")], rows
    return out, rows


def test_two_points_through_mpirun(write_sweep, tmp_path):
    need_mpirun()
    need_train()
    need_build(BIN_DIR, "MPI", "ONEDNN")
    text = """
[sweep]
name = "e2e"
timeout_s = 240
[fixed]
model = "tiny-cnn"
compute = "onednn"
batch_size = 8
num_warmup_batches = 1
num_batches = 4
backend = "ring"
[matrix]
ranks = [1, 2]
"""
    out, rows = run_two_points(write_sweep, tmp_path, text)
    for r in rows:
        assert float(r["total_images_per_sec"]) > 0
        assert r["model"] == "tiny-cnn" and r["compute"] == "onednn" and r["backend"] == "ring"
        assert r["kolo_commit"] and r["cpu_model"] and r["hosts"]
        assert float(r["images_per_sec_per_rank"]) == pytest.approx(
            float(r["total_images_per_sec"]) / int(r["ranks"]), rel=1e-3
        )
        assert "total images/sec" in (out / r["log"]).read_text()
    # Efficiency from the two measured rows, by hand.
    t1, t2 = (float(r["total_images_per_sec"]) for r in rows)
    assert float(rows[1]["scaling_efficiency"]) == pytest.approx(t2 / 2 / t1, abs=1e-4)
    assert (out / "report" / "index.html").exists()
    assert (out / "report" / "plots" / "scaling.png").exists()
    baseline = tmp_path / "baseline.toml"
    baseline.write_text(
        f"[[check]]\nmodel='tiny-cnn'\nranks=2\nefficiency={rows[1]['scaling_efficiency']}\nmax_drop=0.0001\n"
    )
    gate = run_cli("check-regression", str(out / "results.csv"), "--baseline", str(baseline))
    assert gate.returncode == 0, gate.stdout + gate.stderr


def test_replay_points_through_kolo_run(write_sweep, tmp_path):
    need_train()
    text = """
[sweep]
name = "e2e-replay"
timeout_s = 240
[launcher]
kind = "local"
[fixed]
model = "resnet101"
compute = "replay"
profile = "models/profiles/resnet101-h100-b64.json"
batch_size = 64
num_warmup_batches = 1
num_batches = 3
backend = "ring"
[matrix]
ranks = [1, 2]
"""
    out, rows = run_two_points(write_sweep, tmp_path, text)
    for r in rows:
        assert r["compute"] == "replay" and r["backend"] == "ring" and r["transport"] == "tcp"
        assert float(r["total_images_per_sec"]) > 0
        assert "(compute=replay)" in (out / r["log"]).read_text()
    assert (out / "report" / "index.html").exists()
