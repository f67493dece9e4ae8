"""End-to-end sweeps of the real kolo-train: two oneDNN points through mpirun, then the report and
the gate on what they measured; two replay points through kolo-run, which every build can run
(no MPI, oneDNN or CUDA); and two replay points on emulated hosts (scripts/cluster), where this
machine can make them. Skipped, saying why, when kolo-train or a part a test needs is not built
or scripts/cluster check fails."""

import os
import re
import subprocess
from pathlib import Path

import pytest
from reports import schema

from conftest import ROOT, need_build, need_mpirun, run_cli

# The [fixed] settings of the replay sweeps: ResNet-101 at an H100's recorded pace, 3 timed steps.
REPLAY = """model = "resnet101"
compute = "replay"
profile = "models/profiles/resnet101-h100-b64.json"
batch_size = 64
num_warmup_batches = 1
num_batches = 3"""
BIN_DIR = Path(os.environ.get("KOLO_BIN_DIR", ROOT / "build" / "bin"))


def need_train():
    train = BIN_DIR / "kolo-train"
    if not os.access(train, os.X_OK):
        pytest.skip(f"{train} is not built (scripts/build, or set KOLO_BIN_DIR)")


def run_two_points(write_sweep, tmp_path, text):
    """Runs the sweep `text` (ranks 1 and 2) with the real binaries and returns its folder, the
    single-rank baseline's row the runner added and the two points' rows, once it exited 0 with
    all three ok."""
    out = tmp_path / "out"
    result = run_cli("sweep", write_sweep(text), "--out", str(out), "--bin-dir", str(BIN_DIR))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "added the single-rank baseline" in result.stderr
    rows = schema.read_rows(str(out / "results.csv"))
    assert [(r["ranks"], r["backend"], r["status"]) for r in rows] == [
        ("1", "none", "ok"),
        ("1", "ring", "ok"),
        ("2", "ring", "ok"),
    ], rows
    return out, rows[0], rows[1:]


def check_breakdown(row):
    """The time breakdown of a measured row adds up to its step time, and that step time is the one
    its throughput implies."""
    n = {c: float(row[c]) for c in schema.BREAKDOWN}
    step = n["step_time_ms_mean"]
    phases = sum(n[c] for c in schema.PHASES)
    assert phases == pytest.approx(step, rel=0.05), row
    images_per_step = int(row["batch_size"]) * int(row["backward_passes_per_step"] or 1)
    assert 1e3 * images_per_step / float(row["images_per_sec_per_rank"]) == pytest.approx(step, rel=0.05)
    assert min(n.values()) >= 0
    assert n["hidden_comm_ms"] <= n["comm_ms"] + 1e-9 and n["negotiation_ms"] <= n["comm_ms"] + 1e-9


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
    out, base, rows = run_two_points(write_sweep, tmp_path, text)
    assert base["transport"] == "" and float(base["comm_ms"]) == 0 and float(base["comm_bytes_per_step"]) == 0
    for r in [base, *rows]:
        check_breakdown(r)
    for r in rows:
        assert float(r["total_images_per_sec"]) > 0
        assert r["model"] == "tiny-cnn" and r["compute"] == "onednn" and r["backend"] == "ring"
        assert r["kolo_commit"] and r["cpu_model"] and r["hosts"]
        assert float(r["images_per_sec_per_rank"]) == pytest.approx(
            float(r["total_images_per_sec"]) / int(r["ranks"]), rel=1e-3
        )
        assert "total images/sec" in (out / r["log"]).read_text()
    # Efficiency from the measured rows, by hand: against the baseline, and against 1 ring rank.
    t0 = float(base["total_images_per_sec"])
    t1, t2 = (float(r["total_images_per_sec"]) for r in rows)
    assert float(rows[1]["scaling_efficiency"]) == pytest.approx(t2 / 2 / t0, abs=1e-4)
    assert float(rows[1]["efficiency_vs_own_base"]) == pytest.approx(t2 / 2 / t1, abs=1e-4)
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
    text = f"""
[sweep]
name = "e2e-replay"
timeout_s = 240
[launcher]
kind = "local"
[fixed]
{REPLAY}
backend = "ring"
[matrix]
ranks = [1, 2]
"""
    out, base, rows = run_two_points(write_sweep, tmp_path, text)
    for r in rows:
        assert r["compute"] == "replay" and r["backend"] == "ring" and r["transport"] == "auto"
        assert float(r["total_images_per_sec"]) > 0
        assert "(compute=replay)" in (out / r["log"]).read_text()
    for r in [base, *rows]:
        check_breakdown(r)
    # The 2-rank ring sends 2(N-1)/N = 1 x ResNet-101's float32 gradients per step (44,549,160
    # parameters), plus a little negotiation.
    two = rows[1]
    gradient_bytes = 44_549_160 * 4
    assert float(two["comm_bytes_per_step"]) == pytest.approx(gradient_bytes, rel=0.01)
    assert float(two["comm_ms"]) > 0 and float(two["comm_gbytes_per_sec"]) > 0
    assert float(rows[0]["comm_bytes_per_step"]) < 1e4  # one rank sends nothing but agreement
    assert (out / "report" / "index.html").exists()


def test_parameter_server_breakdown_and_efficiency_through_kolo_run(write_sweep, tmp_path):
    # The parameter server's pushes and pulls, measured: its breakdown adds up, each worker sends
    # its whole gradient per step, and it is judged against the same baseline as the ring.
    need_train()
    text = f"""
[sweep]
name = "e2e-ps"
timeout_s = 240
[launcher]
kind = "local"
[fixed]
{REPLAY}
ranks = 2
[matrix]
backend = ["ring", "ps"]
"""
    out = tmp_path / "out"
    result = run_cli("sweep", write_sweep(text), "--out", str(out), "--bin-dir", str(BIN_DIR), "--no-report")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = schema.read_rows(str(out / "results.csv"))
    assert [(r["backend"], r["status"]) for r in rows] == [("none", "ok"), ("ring", "ok"), ("ps", "ok")]
    for r in rows:
        check_breakdown(r)
    base, ring, ps = rows
    assert ring["baseline_images_per_sec"] == ps["baseline_images_per_sec"] == base["total_images_per_sec"]
    assert float(ps["comm_bytes_per_step"]) == pytest.approx(44_549_160 * 4, rel=0.01)
    assert float(ps["negotiation_ms"]) == 0  # servers take what comes: nothing to agree on
    # One denominator: whichever is faster is the more efficient.
    faster = float(ring["total_images_per_sec"]) > float(ps["total_images_per_sec"])
    assert faster == (float(ring["scaling_efficiency"]) > float(ps["scaling_efficiency"]))


def test_two_emulated_hosts_through_the_cluster(write_sweep, tmp_path):
    # The real kolo-train on two emulated hosts (network namespaces behind 1 Gbit/s tbf links) at
    # time dilation 25: the rows say where they ran and what the links stand for, the ring's
    # bandwidth while communicating stays under the 25 Gbit/s its links stand for, the single
    # rank keeps the profile's pace, and the cluster is gone at the end.
    from reports import cluster

    need_mpirun()
    need_train()
    need_build(BIN_DIR, "MPI")
    found = cluster.check()
    if not found.ok:
        pytest.skip(f"scripts/cluster check fails here: {found.text}")
    text = f"""
[sweep]
name = "e2e-cluster"
timeout_s = 300
[launcher]
kind = "cluster"
env = {{ KOLO_PEER_TIMEOUT_SECONDS = "120" }}
[fixed]
{REPLAY.replace("num_batches = 3", "num_batches = 2")}
backend = "ring"
link = "1gbit"
dilation = 25
[matrix]
ranks = [1, 2]
"""
    out, base, rows = run_two_points(write_sweep, tmp_path, text)
    for r in [base, *rows]:
        assert (r["network"], r["link"], r["link_represented"], r["dilation"]) == (
            "emulated",
            "1gbit",
            "25gbit",
            "25",
        )
        check_breakdown(r)
    two = rows[1]
    assert (two["nodes"], two["hosts"], two["ranks_per_host"]) == ("2", "h0;h1", "1")
    assert (base["nodes"], base["hosts"]) == ("1", "h0")
    # 25 Gbit/s is 3.125 GB/s: the ring moves its gradients no faster than the links it stands
    # for (at the represented pace), and its step is longer than the single rank's.
    assert 0 < float(two["comm_gbytes_per_sec"]) < 3.125
    assert float(two["comm_bytes_per_step"]) == pytest.approx(44_549_160 * 4, rel=0.01)
    assert float(two["step_time_ms_mean"]) > float(base["step_time_ms_mean"])
    # The single rank at the represented pace: the H100 profile's step (83 ms), not 25 times it.
    assert 75 < float(base["step_time_ms_mean"]) < 160
    assert "dilation=25" in (out / two["log"]).read_text()
    name = re.search(r" up --name (\w+)", (out / "cluster.log").read_text())[1]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ln for ln in listed.splitlines() if ln.startswith(name + "-")], listed
